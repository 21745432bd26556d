"""Prompt formats: the exact GLAM text, its history window, and the chat variant."""

from __future__ import annotations

import pytest
from helpers_tiny import ACTION_WORDS, tiny_tokenizer

from glam.policy.prompts import PromptHistory, build_prompt, chat_prompt, glam_prompt

OBS_0 = ["You see a wall 2 steps forward", "You see a red ball 1 step left and 2 steps forward"]
OBS_1 = ["You carry a red ball"]
OBS_2 = ["You see a wall 1 step forward"]
OBS_3 = ["You see a grey key 2 steps right"]


def test_glam_prompt_is_the_original_format_without_trailing_space():
    prompt = glam_prompt("go to the red ball", ACTION_WORDS, [OBS_0, OBS_1], ["pick up"])
    assert prompt == (
        "Possible action of the agent: turn left, turn right, go forward, pick up, drop, toggle\n"
        "Goal of the agent: go to the red ball\n"
        "Observation 0: You see a wall 2 steps forward, "
        "You see a red ball 1 step left and 2 steps forward,\n"
        "Action 0: pick up\n"
        "Observation 1: You carry a red ball,\n"
        "Action 1:"
    )


def test_french_headers():
    prompt = glam_prompt("va à la balle rouge", ["tourner à gauche"], [["Tu vois un mur"]], [])
    assert prompt == "Possible action of the agent: tourner à gauche\n" + (
        "Goal of the agent: va à la balle rouge\nObservation 0: Tu vois un mur,\nAction 0:"
    )
    french = glam_prompt(
        "va à la balle rouge", ["tourner à gauche"], [["Tu vois un mur"]], [], language="fr"
    )
    assert french.splitlines()[:2] == [
        "Actions possibles de l'agent: tourner à gauche",
        "But de l'agent: va à la balle rouge",
    ]
    assert french.endswith("Observation 0: Tu vois un mur,\nAction 0:")


def test_empty_observation_has_no_stray_comma():
    assert glam_prompt("open the door", ["toggle"], [[]], []).endswith("Observation 0:\nAction 0:")


@pytest.mark.parametrize(
    ("observations", "actions", "message"),
    [
        ([], [], "observations is empty"),
        ([OBS_0, OBS_1], [], "need 1 actions"),
        ([OBS_0], ["pick up"], "need 0 actions"),
        (["You see a wall"], [], "is a string"),
    ],
)
def test_inconsistent_history_is_refused(observations, actions, message):
    with pytest.raises((ValueError, TypeError), match=message):
        glam_prompt("go to the red ball", ACTION_WORDS, observations, actions)


def test_unknown_language_is_named():
    with pytest.raises(ValueError, match="language='de'"):
        glam_prompt("go", ACTION_WORDS, [OBS_0], [], language="de")


def test_history_keeps_the_last_observations_and_the_actions_between_them():
    history = PromptHistory(nbr_obs=3)
    for observation, action in [(OBS_0, "turn left"), (OBS_1, "go forward"), (OBS_2, "drop")]:
        history.add_observation(observation)
        history.add_action(action)
    history.add_observation(OBS_3)
    assert history.observations == [OBS_1, OBS_2, OBS_3]
    assert history.actions == ["go forward", "drop"]
    prompt = history.prompt("go to the red ball", ACTION_WORDS)
    assert prompt == glam_prompt(
        "go to the red ball", ACTION_WORDS, [OBS_1, OBS_2, OBS_3], ["go forward", "drop"]
    )
    assert "Observation 0: You carry a red ball," in prompt  # renumbered within the window
    assert prompt.endswith("Action 2:")


def test_history_before_the_window_is_full_and_after_reset():
    history = PromptHistory(nbr_obs=3)
    history.add_observation(OBS_0)
    assert history.prompt("go", ACTION_WORDS).endswith("Action 0:")
    history.add_action("pick up")
    history.add_observation(OBS_1)
    assert history.actions == ["pick up"]
    history.reset()
    history.add_observation(OBS_2)
    assert history.observations == [OBS_2] and history.actions == []


def test_history_of_one_observation_has_no_actions():
    history = PromptHistory(nbr_obs=1)
    history.add_observation(OBS_0)
    history.add_action("drop")
    history.add_observation(OBS_1)
    assert history.prompt("go", ACTION_WORDS) == glam_prompt("go", ACTION_WORDS, [OBS_1], [])


def test_history_enforces_alternation():
    history = PromptHistory()
    with pytest.raises(RuntimeError, match="without a new observation"):
        history.add_action("drop")
    history.add_observation(OBS_0)
    with pytest.raises(RuntimeError, match="add_action is missing"):
        history.add_observation(OBS_1)
    history.add_action("drop")
    with pytest.raises(RuntimeError, match="call add_observation"):
        history.prompt("go", ACTION_WORDS)
    with pytest.raises(ValueError, match="nbr_obs"):
        PromptHistory(nbr_obs=0)


def test_chat_prompt_wraps_the_glam_text_in_the_template():
    tokenizer = tiny_tokenizer()
    prompt = chat_prompt(tokenizer, "go to the red ball", ACTION_WORDS, [OBS_0], [])
    text = glam_prompt("go to the red ball", ACTION_WORDS, [OBS_0], [])
    assert prompt.startswith("<s>user\nReply with the agent's next action only")
    assert text in prompt
    assert prompt.endswith("</s>\n<s>assistant\n")  # the generation prompt: the answer follows


def test_chat_prompt_needs_a_template():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        chat_prompt(tokenizer, "go", ACTION_WORDS, [OBS_0], [])


def test_build_prompt_dispatches_on_the_format():
    tokenizer = tiny_tokenizer()
    arguments = ("go to the red ball", ACTION_WORDS, [OBS_0], [])
    assert build_prompt("glam", *arguments) == glam_prompt(*arguments)
    assert build_prompt("chat", *arguments, tokenizer=tokenizer) == chat_prompt(
        tokenizer, *arguments
    )
    with pytest.raises(ValueError, match="needs the tokenizer"):
        build_prompt("chat", *arguments)
    with pytest.raises(ValueError, match="prompt_format='xml'"):
        build_prompt("xml", *arguments)
    history = PromptHistory()
    history.add_observation(OBS_0)
    assert history.prompt(
        "go to the red ball", ACTION_WORDS, prompt_format="chat", tokenizer=tokenizer
    ) == chat_prompt(tokenizer, *arguments)
