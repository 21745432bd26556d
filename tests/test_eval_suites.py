"""Post-training test suites: each changes one thing against `no_change`, or says it cannot."""

from __future__ import annotations

import re

import numpy as np
import pytest

from glam.eval.agents import ActRequest, Decision, FormattedHistory, RandomAgent, ScoringAgent
from glam.eval.episodes import prompt_format_of, run_suite
from glam.eval.suites import SUITES, get_suites, plan_suite, task_parts

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
    """Random actions from the per-episode RNG; records every prompt it reads and every room it
    starts in (the grid, the agent's position and direction)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.words: set[tuple[str, ...]] = set()
        self.rooms: list[tuple[bytes, tuple[int, ...], int, tuple[int, ...]]] = []

    def act(self, request: ActRequest) -> list[Decision]:
        self.prompts.extend(request.prompts)
        self.words.add(request.action_words)
        for env, new in zip(request.envs, request.new_episode, strict=True):
            if new:
                base = env.unwrapped
                grid = base.grid.encode()
                self.rooms.append(
                    (grid.tobytes(), grid.shape, base.agent_dir, tuple(base.agent_pos))
                )
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
    assert run.level == "BabyAI-MixedTrainLocal-v0"
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


def _objects(grid_bytes: bytes, shape: tuple[int, ...]) -> int:
    """Objects in an encoded grid other than walls and empty cells."""
    from minigrid.core.constants import OBJECT_TO_IDX

    types = np.frombuffer(grid_bytes, dtype=np.uint8).reshape(shape)[..., 0]
    return int(np.isin(types, [OBJECT_TO_IDX[t] for t in ("key", "ball", "box")]).sum())


def test_french_plays_the_evaluated_level_from_the_same_rooms() -> None:
    """The issue's case: GoToLocalS6N2 in French is a 6x6 room with 2 objects, the same rooms as
    in English (not GoToLocalFrench's 8x8 with 8), with French words for the agent's actions."""
    level = "BabyAI-GoToLocalS6N2-v0"
    english, base_run = _play("no_change", episodes=6, level=level, action_space="nav")
    french, run = _play("french", episodes=6, level=level, action_space="nav")
    assert run.level == level and run.plan.language == "fr"
    assert [e.seed for e in run.episodes] == [e.seed for e in base_run.episodes]
    # Same seeds, same rooms: grid, agent position and direction, episode by episode.
    assert sorted(french.rooms) == sorted(english.rooms) and len(french.rooms) == 6
    for grid_bytes, shape, _, _ in french.rooms:
        assert shape[:2] == (6, 6) and _objects(grid_bytes, shape) == 2
    # Same missions, said in French; same outcomes (the random agent draws from the same RNGs).
    assert all(e.mission.startswith("va à ") for e in run.episodes)
    assert [(e.success, e.length) for e in run.episodes] == [
        (e.success, e.length) for e in base_run.episodes
    ]
    assert french.words == {("tourner à gauche", "tourner à droite", "avancer")}
    assert french.prompts[0].startswith("Actions possibles de l'agent: tourner à gauche")
    assert "But de l'agent: va à " in french.prompts[0]


def test_a_navigation_agent_is_not_evaluated_on_new_composition() -> None:
    level = "BabyAI-GoToLocalS6N2-v0"
    agent, run = _play("new_composition", episodes=4, level=level, action_space="nav")
    assert not run.plan.applies and run.episodes == [] and agent.prompts == []
    reason = run.plan.not_applicable
    assert "'pick up', 'drop'" in reason and "turn left, turn right, go forward" in reason
    assert run.level == "BabyAI-PickUpSeqPickUpLocal-v0"
    # With every action, a goto level still teaches neither picking up nor sequences.
    _, run = _play("new_composition", episodes=4, level=level)
    assert run.episodes == []
    assert "never pickup nor two actions in sequence" in run.plan.not_applicable
    # The GLAM mix asks both parts, never this composition: it applies.
    _, run = _play("new_composition", episodes=2)
    assert run.plan.applies and len(run.episodes) == 2


@pytest.mark.parametrize(
    ("name", "level", "action_space", "prompt_format", "reason"),
    [
        ("renamed_actions", "BabyAI-MixedTrainLocal-v0", "noop", "glam", "'sleep', 'do nothing'"),
        ("french", "BabyAI-MixedTrainLocal-v0", "noop", "glam", "no counterpart for 'sleep'"),
        ("french", "BabyAI-GoToLocal-v0", None, "balrog", "BALROG prompt"),
        ("new_composition", "BabyAI-PickUpSeqPickUpLocal-v0", None, "glam", "already asks"),
        ("new_composition", "BabyAI-PickupDist-v0", None, "glam", "never two actions in sequence"),
        ("renamed_actions", "BabyAI-GoToLocal-v0", "nav", "glam", ""),
        ("french", "BabyAI-BossLevel-v0", None, "chat", ""),
        ("french", "BabyAI-GoToLocal-v0", None, "none", ""),
        ("new_composition", "BabyAI-MixedTestLocal-v0", "default", "glam", ""),
        ("new_composition", "BabyAI-PickUpThenGoToLocal-v0", None, "balrog", ""),
    ],
)
def test_plan_says_when_a_suite_does_not_apply(
    name: str, level: str, action_space: str | None, prompt_format: str, reason: str
) -> None:
    plan = plan_suite(
        SUITES[name],
        level=level,
        action_space=action_space,
        prompt_format=prompt_format,
        probe_seeds=range(10**12, 10**12 + 20),
    )
    assert plan.applies == (not reason)
    assert reason in plan.not_applicable
    assert plan.prompt_format == prompt_format
    assert plan.level == (SUITES[name].level or level)


def test_task_parts() -> None:
    assert task_parts("goto") == {"goto"}
    assert task_parts("pickup_then_goto") == task_parts("goto_after_pickup")
    assert task_parts("pickup_then_pickup") == {"pickup", "two actions in sequence"}


def test_the_prompt_format_each_agent_reads() -> None:
    def scorer(prompts, words):
        raise AssertionError("not called")

    assert prompt_format_of(RandomAgent()) == "none"
    assert prompt_format_of(ScoringAgent("s", scorer, greedy=True)) == "glam"
    chat = ScoringAgent(
        "c", scorer, greedy=True, history_factory=lambda n: FormattedHistory(n, "chat", None)
    )
    assert prompt_format_of(chat) == "chat"
