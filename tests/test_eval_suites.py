"""Post-training test suites: each rewrite changes what the model reads, and nothing else."""

from __future__ import annotations

import re

import pytest

from glam.eval.agents import ActRequest, Decision, RandomAgent
from glam.eval.episodes import run_suite
from glam.eval.suites import SUITES, get_suites

PROMPT = (
    "Possible action of the agent: turn left, turn right, go forward, pick up, drop, toggle\n"
    "Goal of the agent: put the red key next to the grey box\n"
    "Observation 0: You see a wall 2 steps forward, You see a blue ball 1 step left, "
    "You see a locked purple door 2 steps right, You see a yellow key 3 steps forward, "
    "You see a green box 1 step right and 1 step forward,\n"
    "Action 0: turn left\n"
    "Observation 1: You carry a red key, You see a wall 1 step forward,\n"
    "Action 1:"
)
REWRITE_SUITES = [name for name, suite in SUITES.items() if suite.substitutions]
ENV_SUITES = [name for name, suite in SUITES.items() if not suite.substitutions]
WORDS = re.compile(r"\w+|\W+")


def test_the_eleven_suites_of_the_paper_are_defined() -> None:
    assert list(SUITES) == [
        "no_change",
        "other_nouns",
        "adj_synonyms",
        "invented_nouns",
        "invented_adjectives",
        "invented_words",
        "intro_speaker",
        "intro_agent",
        "french",
        "renamed_actions",
        "new_composition",
    ]
    assert ENV_SUITES == ["no_change", "french", "renamed_actions", "new_composition"]


@pytest.mark.parametrize("name", REWRITE_SUITES)
def test_rewrite_changes_only_the_substituted_words(name: str) -> None:
    suite = SUITES[name]
    rewritten = suite.rewrite(PROMPT)
    assert rewritten != PROMPT
    if name.startswith("intro_"):
        # Only the header changes: every other line is kept byte for byte.
        old_lines, new_lines = PROMPT.splitlines(), rewritten.splitlines()
        changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True)) if a != b]
        assert changed == [1]
        assert new_lines[1] == old_lines[1].replace(
            "Goal of the agent", suite.substitutions["Goal of the agent"]
        )
        return
    # Word by word: a word differs only where the suite maps it, and then it is its image.
    old_words, new_words = WORDS.findall(PROMPT), WORDS.findall(rewritten)
    assert len(old_words) == len(new_words)
    for old, new in zip(old_words, new_words, strict=True):
        assert new == suite.substitutions.get(old, old)
    # ... and every word the suite maps that occurs in the prompt is gone.
    assert not set(suite.substitutions) & set(new_words)


def test_substitutions_match_whole_words_plurals_and_capitals() -> None:
    text = "Red keys, a red key; redo the boxes, reddish keyboard, bored Ballroom box."
    assert SUITES["invented_words"].rewrite(text) == (
        "Faze daxes, a faze dax; redo the afzes, reddish keyboard, bored Ballroom afze."
    )
    assert SUITES["other_nouns"].rewrite("two balls and a key") == "two tables and a chair"


def test_the_table_holds_the_papers_words() -> None:
    assert SUITES["other_nouns"].substitutions["key"] == "chair"
    assert SUITES["adj_synonyms"].substitutions["grey"] == "silver"
    assert SUITES["invented_words"].substitutions["box"] == "afze"
    assert SUITES["invented_words"].substitutions["purple"] == "vurst"
    assert SUITES["intro_agent"].substitutions == {"Goal of the agent": "You have to"}


def test_unknown_suite_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown suite.*no_chnage.*known suites: no_change"):
        get_suites(["no_change", "no_chnage"])


class _Recorder(RandomAgent):
    """Random actions from the per-episode RNG; records every prompt it reads."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.words: set[tuple[str, ...]] = set()

    def act(self, request: ActRequest) -> list[Decision]:
        self.prompts.extend(request.prompts)
        self.words.add(request.action_words)
        return super().act(request)


def _play(
    name: str, episodes: int = 3, level: str = "BabyAI-MixedTrainLocal-v0", **options
) -> tuple[_Recorder, list]:
    agent = _Recorder()
    run = run_suite(
        agent,
        SUITES[name],
        level=level,
        episodes=episodes,
        num_envs=3,
        seed_base=10**9,
        nbr_obs=3,
        max_steps=12,
        **options,
    )
    return agent, run


@pytest.mark.parametrize("name", ["invented_words", "intro_speaker"])
def test_the_agent_reads_the_rewritten_prompt_of_the_same_episodes(name: str) -> None:
    baseline, base_run = _play("no_change")
    changed, run = _play(name)
    assert changed.prompts == [SUITES[name].rewrite(p) for p in baseline.prompts]
    assert all(a != b for a, b in zip(baseline.prompts, changed.prompts, strict=True))
    assert run.prompts_rewritten == run.prompts_seen > 0
    # Nothing else changed: same seeds, missions, actions, so the same outcomes.
    assert run.episodes == base_run.episodes


def test_env_suites_change_the_env_not_the_words() -> None:
    french, run = _play("french", episodes=2)
    assert run.level == "BabyAI-GoToLocalFrench-v0"
    assert "Tu vois" in french.prompts[0] and "avancer" in french.prompts[0]
    assert french.words == {
        ("tourner à gauche", "tourner à droite", "avancer", "ramasser", "lâcher", "basculer")
    }

    renamed, run = _play("renamed_actions", episodes=2)
    assert renamed.words == {
        ("rotate left", "rotate right", "move ahead", "take", "release", "switch")
    }
    assert "rotate left" in renamed.prompts[0] and "turn left" not in renamed.prompts[0]
    assert run.prompts_rewritten == 0

    _, run = _play("new_composition", episodes=2)
    assert all(re.match(r"pick up .*, then pick up ", e.mission) for e in run.episodes)


def test_renamed_actions_rename_the_agents_own_action_space() -> None:
    """An agent trained on the navigation actions meets their three renamed words, no more."""
    level = "BabyAI-GoToRedBallNoDists-v0"
    renamed, _ = _play("renamed_actions", episodes=2, level=level, action_space="nav")
    assert renamed.words == {("rotate left", "rotate right", "move ahead")}
    plain, _ = _play("no_change", episodes=2, level=level, action_space="nav")
    assert plain.words == {("turn left", "turn right", "go forward")}
