"""RL-GPT's agents around the coded actions (glam.codeact): the slow agent's choice (scored,
asked in words, random), the fast agent's code (library, or a chat model behind a real HTTP
server on 127.0.0.1) through the sandbox's gate, and the critic's decisions and records.

.venv/bin/python -m pytest tests/test_codeact_agents.py
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from helpers_tiny import one_torch_thread, save_tiny_model

import babyai_text
from glam.codeact.critic import CriticRules, Iteration, judge, load_iterations
from glam.codeact.env import CodedActionsEnv, CodedActionStats
from glam.codeact.library import skill_source
from glam.codeact.planner import (
    ChatChooser,
    MissionFamily,
    RandomChooser,
    ScoredChooser,
    candidate_actions,
    family_prompt,
    parse_names,
    sample_family,
)
from glam.codeact.sandbox import Sandbox
from glam.codeact.writer import ChatWriter, LibraryWriter, extract_code, refusals, sources
from glam.llm.chat import Completion, Message
from glam.llm.config import ClientConfig
from glam.llm.remote import OpenAIChatClient
from glam.llm.server import ChatServer
from glam.teach.scorers import LocalScorer, SubgoalScorer

__all__ = ["one_torch_thread"]  # autouse fixture: one torch thread in this module

WORDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
FAMILY = MissionFamily("BabyAI-GoToLocal-v0", ("go to the red ball", "go to a blue key"), WORDS)
CANDIDATES = [
    "go to the red ball",
    "go to the blue key",
    "pick up the red ball",
    "pick up the blue key",
    "explore",
    "go to the object in the mission",
    "pick up the object in the mission",
]


def action(body: str) -> str:
    """A coded action whose `step` has `body` (lines separated by newlines)."""
    lines = "\n".join("    " + line for line in body.splitlines())
    return f"def step(view, memory):\n{lines}\n"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(WORDS) as shared:
        yield shared


# ---- the slow agent ----


class FakeScorer(SubgoalScorer):
    """Known preferences: each candidate's score is given; the prompts are recorded."""

    def __init__(self, preferences: dict[str, float]) -> None:
        self.preferences = preferences
        self.prompts: list[str] = []

    def log_likelihoods(self, prompts, candidates):
        self.prompts.extend(prompts)
        return [torch.tensor([self.preferences[c] for c in cands]) for cands in candidates]


def test_candidates_are_the_library_skills_over_the_familys_objects() -> None:
    assert candidate_actions(FAMILY) == CANDIDATES
    unlock = MissionFamily("BabyAI-UnlockLocal-v0", ("open the door",), WORDS)
    assert candidate_actions(unlock) == [
        "go to the key",
        "go to the door",
        "pick up the key",  # a door may be locked: its key
        "open the door",
        "explore",
        "go to the object in the mission",
        "pick up the object in the mission",
    ]
    family = sample_family("BabyAI-GoToLocal-v0", episodes=3)
    assert len(family.missions) == 3 and family.action_words == WORDS
    # What is in view at the start counts too: more objects than the missions name.
    named = sum(mission.startswith("go to") for mission in family.missions)
    assert len([c for c in candidate_actions(family) if c.startswith("go to")]) > named


def test_the_scored_chooser_takes_the_top_k() -> None:
    preferences = dict(zip(CANDIDATES, [-3.0, -1.0, -5.0, -2.0, -4.0, -6.0, -7.0], strict=True))
    scorer = FakeScorer(preferences)
    plan = ScoredChooser(scorer).choose(FAMILY, 2)
    assert plan.coded == ["go to the blue key", "pick up the blue key"]
    assert plan.left_to_rl == ["go to the red ball", "pick up the red ball", *CANDIDATES[4:]]
    assert scorer.prompts == [family_prompt(FAMILY, None)]
    assert scorer.prompts[0].endswith("A sub-action worth writing as code:")


def test_the_critics_feedback_carries_kept_actions_and_excludes_dropped_ones() -> None:
    iteration = reviewed_iteration(
        {"go to the blue key": (10, 0), "go to the red ball": (0, 0), "explore": (8, 8)},
        generated=(),
    )
    feedback = iteration.feedback()
    assert feedback.carried() == ["go to the blue key"]
    assert feedback.excluded() == {"go to the red ball", "explore"}
    scorer = FakeScorer(
        dict(zip(CANDIDATES, [0.0, -1.0, -5.0, -2.0, 0.0, -6.0, -7.0], strict=True))
    )
    plan = ScoredChooser(scorer).choose(FAMILY, 2, feedback)
    assert plan.coded == ["go to the blue key", "pick up the blue key"]
    assert plan.carried == ["go to the blue key"]
    assert "- explore: used 8 times, finished 0, failures runtime 8" in scorer.prompts[0]


def test_a_real_tiny_model_chooses_deterministically(tmp_path: Path) -> None:
    scorer = LocalScorer.load(str(save_tiny_model(tmp_path / "llama", "llama")))
    first = ScoredChooser(scorer).choose(FAMILY, 3)
    again = ScoredChooser(scorer).choose(FAMILY, 3)
    assert first == again and len(first.coded) == 3 and set(first.coded) <= set(CANDIDATES)
    scores = scorer.log_likelihoods([family_prompt(FAMILY, None)], [CANDIDATES])[0]
    best = [CANDIDATES[i] for i in torch.argsort(scores, descending=True, stable=True)[:3]]
    assert first.coded == best


def test_the_random_chooser_is_seeded_and_takes_as_many() -> None:
    family = sample_family("BabyAI-PutNextLocal-v0", episodes=4)
    draws = [RandomChooser(seed).choose(family, 4).coded for seed in (0, 0, 1)]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert all(len(draw) == 4 == len(set(draw)) for draw in draws)
    assert set(draws[2]) <= set(candidate_actions(family))


def test_a_chat_answer_is_parsed_line_by_line_invalid_lines_reported() -> None:
    answer = (
        "Here are the sub-actions to code:\n"
        "1. Go to the red ball.\n"
        "- `explore`\n"
        "- fly to the moon\n"
        "\n"
        "- go to a red ball\n"
        "* pick up the blue key\n"
    )
    picked, ignored = parse_names(answer, CANDIDATES, 2)
    assert picked == ["go to the red ball", "explore"]
    assert ignored == [
        "'Here are the sub-actions to code:': not a candidate",
        "'- fly to the moon': not a candidate",
        "'- go to a red ball': repeated",
        "'* pick up the blue key': beyond the 2 asked",
    ]


# ---- a chat model behind a real server on 127.0.0.1 ----


class ScriptedChat:
    """What `ChatServer` needs of a client: answers fixed per question (the first answer
    whose key is in the last message), as a code-writing model would write them."""

    model_id = "scripted"

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.asked: list[list[Message]] = []

    def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        *,
        temperature: float,
        max_tokens: int,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        completions = []
        for messages in conversations:
            self.asked.append(list(messages))
            question = messages[-1]["content"]
            text = next(answer for key, answer in self.answers.items() if key in question)
            completions.append(Completion(text, "stop", len(question), len(text)))
        return completions


TURN_THREE_TIMES = action("if view['steps'] >= 3:\n    return 'done'\nreturn 'turn left'")
ANSWERS = {
    '"turn around"': f"Sure. This turns until it faces back:\n```python\n{TURN_THREE_TIMES}```\n",
    '"read the map"': "```python\nimport os\n" + action("return 'done'") + "```",
    '"wave"': "I cannot write that.",
    "Candidate sub-actions": "explore\nThe ball, I think\ngo to the blue key\n",
}


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[ScriptedChat, OpenAIChatClient]]:
    scripted = ScriptedChat(ANSWERS)
    with ChatServer(scripted, port=0) as server:  # type: ignore[arg-type]
        server.start()
        cfg = ClientConfig(backend="openai", base_url=server.url, timeout=30, max_retries=0)
        with OpenAIChatClient(cfg) as client:
            yield scripted, client


def test_a_chat_model_chooses_through_the_server(chat) -> None:
    scripted, client = chat
    plan = ChatChooser(client, seed=0).choose(FAMILY, 3)
    assert plan.coded == ["explore", "go to the blue key"]  # it named two: two are coded
    assert plan.ignored == ["'The ball, I think': not a candidate"]
    question = scripted.asked[-1][-1]["content"]
    assert "- pick up the red ball" in question and "Choose 3" in question


def test_library_code_runs_in_the_sandbox_on_a_real_level(sandbox) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    obs, _ = env.reset(seed=0)
    family = MissionFamily("BabyAI-GoToLocal-v0", (obs["mission"],), WORDS)
    drafts = LibraryWriter().write([obs["mission"], "explore", "fly"], family)
    assert [d.admitted for d in drafts] == [True, True, False]
    assert drafts[0].source == skill_source(obs["mission"]) and drafts[0].origin == "library"
    assert "no skill is named 'fly'" in refusals(drafts)["fly"]
    coded = CodedActionsEnv(env, sources(drafts), sandbox, max_steps_per_action=64)
    coded.reset(seed=0)
    _, reward, terminated, _, info = coded.step(obs["mission"])
    assert terminated and info["success"] and reward > 0


def test_generated_code_goes_through_the_same_gate_and_sandbox(chat, sandbox) -> None:
    _, client = chat
    drafts = ChatWriter(client, seed=0).write(["turn around", "read the map", "wave"], FAMILY)
    assert drafts[0].admitted and drafts[0].source == TURN_THREE_TIMES
    assert drafts[0].origin == "generated" and "Sure." in drafts[0].answer
    assert refusals(drafts) == {
        "read the map": "Line 1: import is not allowed",
        "wave": "the answer has no code block defining step(view, memory)",
    }
    assert (
        sandbox.validate("import os\n" + action("return 'done'"))
        == refusals(drafts)["read the map"]
    )
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    coded = CodedActionsEnv(env, sources(drafts), sandbox)
    coded.reset(seed=0)
    _, _, _, _, info = coded.step("turn around")
    assert (info["codeact"]["outcome"], info["primitive_steps"]) == ("done", 3)


def test_the_code_writer_is_told_the_api_and_the_last_errors(chat) -> None:
    scripted, client = chat
    iteration = reviewed_iteration({"turn around": (6, 6)}, generated=("turn around",))
    ChatWriter(client).write(["turn around"], FAMILY, iteration.feedback())
    system, user = (message["content"] for message in scripted.asked[-1])
    assert 'view["front"]' in system and "def step(view, memory)" in system
    assert "Your previous version failed" in user and "KeyError: 'missing' (line 2)" in user


def test_code_is_taken_from_the_block_that_defines_step() -> None:
    text = "```\nprint(1)\n```\nThen:\n```py\ndef step(view, memory):\n    return 'done'\n```"
    assert extract_code(text) == "def step(view, memory):\n    return 'done'\n"
    assert extract_code("def step(view, memory):\n    return 'done'") is not None
    assert extract_code("no code here") is None


# ---- the critic ----


def reviewed_iteration(uses: dict[str, tuple[int, int]], generated: Sequence[str]) -> Iteration:
    """An iteration reviewed on stats made up of (uses, failures) per action."""
    stats = {}
    for name, (count, failed) in uses.items():
        entry = CodedActionStats()
        for k in range(count):
            error = ("runtime", "KeyError: 'missing' (line 2)") if k < failed else None
            entry.record("failed" if error else "done", 1, 0.0, error)
        stats[name] = entry
    origins = {name: "generated" if name in generated else "library" for name in uses}
    iteration = Iteration(0, "local", "library", {n: "" for n in uses}, origins)
    iteration.review(stats)
    return iteration


def test_the_critic_drops_failing_and_unused_actions_and_keeps_working_ones(
    sandbox, tmp_path: Path
) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    broken = action("return view['nothing']")
    chosen = {"pick up the key": broken, "explore": skill_source("explore")}
    chosen["go to the red ball"] = skill_source("go to the red ball")
    coded = CodedActionsEnv(env, chosen, sandbox)
    for seed in range(3):  # a scripted policy: the broken action twice, then explore
        coded.reset(seed=seed)
        for name in ("pick up the key", "pick up the key", "explore"):
            coded.step(name)
    stats = coded.pop_stats()
    rules = CriticRules(max_failure_rate=0.5, min_uses=3)
    decisions = judge(stats, rules)
    assert {name: d.verdict for name, d in decisions.items()} == {
        "pick up the key": "drop",
        "explore": "keep",
        "go to the red ball": "drop",
    }
    assert decisions["pick up the key"].reason == (
        "failed 6 of 6 uses (runtime 6); last error: KeyError: 'nothing' (line 2)"
    )
    assert decisions["go to the red ball"].reason == "unused over the phase"
    # Generated code that fails is rewritten rather than dropped; library code cannot be.
    assert judge(stats, rules, {"pick up the key"})["pick up the key"].verdict == "rewrite"

    iteration = Iteration(
        index=1,
        chooser="local",
        writer="chat",
        sources=chosen,
        origins={
            "pick up the key": "generated",
            "explore": "library",
            "go to the red ball": "library",
        },
        refused={"read the map": "Line 1: import is not allowed"},
        left_to_rl=["go to the blue key"],
    )
    feedback = iteration.review(stats, rules)
    assert feedback.carried() == ["pick up the key", "explore"]
    assert feedback.excluded() == {"go to the red ball", "read the map"}
    assert feedback.actions["explore"].finished == 3
    assert feedback.actions["pick up the key"].failures == {"runtime": 6}
    assert "read the map: its code was refused (Line 1: import is not allowed); dropped" in (
        feedback.lines()
    )
    path = iteration.save(tmp_path / "codeact")
    assert path.name == "iteration_001.json"
    loaded = Iteration.load(path)
    assert loaded == iteration and loaded.feedback() == feedback
    assert load_iterations(tmp_path / "codeact") == [iteration]
