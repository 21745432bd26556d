"""RL-GPT's outer loop in the PPO trainer (`glam.codeact.loop`, `glam.codeact.hook`): the slots
of the coded actions across iterations, frames counted per primitive step, a real run whose
chooser and code writer answer through an OpenAI-compatible server on 127.0.0.1 (the critic
rewrites a failing generated action once, then drops it; its slot takes another action),
resuming, the config's refusals, and a 2-process run."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from accelerate import Accelerator
from helpers_couplings import SMALL_SYMBOLIC
from helpers_launch import accelerate_launch
from helpers_tiny import one_torch_thread

import babyai_text
from glam.baselines.symbolic import build_symbolic_policy
from glam.codeact.chat_critic import ChatCritic, parse_verdicts
from glam.codeact.critic import CriticRules, Decision, Feedback, judge, load_iterations
from glam.codeact.env import CodedActionsEnv, CodedActionStats
from glam.codeact.library import skill_source
from glam.codeact.loop import OuterLoop, slot_changes
from glam.codeact.planner import FixedChooser, MissionFamily, RandomChooser, candidate_actions
from glam.codeact.sandbox import Sandbox
from glam.codeact.writer import Draft, LibraryWriter, admit
from glam.couplings import coupling_hooks, coupling_policy_factory
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.llm.chat import Completion
from glam.llm.config import ClientConfig
from glam.llm.remote import OpenAIChatClient
from glam.llm.server import ChatServer
from glam.policy.files import CheckpointError
from glam.ppo.hooks import TrainerHook
from glam.ppo.setup import build_policy
from glam.ppo.trainer import train
from glam.run_config import compose_run
from glam.runs.errors import SetupError
from glam.runs.folder import latest_checkpoint

__all__ = ["one_torch_thread"]  # autouse fixture: one torch thread in this module

ROOT = Path(__file__).resolve().parents[1]
FAMILY = MissionFamily(
    "BabyAI-GoToLocal-v0",
    ("go to the red ball", "go to the blue key", "go to a purple box"),
    ("turn left", "turn right", "go forward", "pick up", "drop", "toggle"),
)


def stats(uses: int, failed: int = 0) -> CodedActionStats:
    entry = CodedActionStats()
    for i in range(uses):
        outcome = "failed" if i < failed else "done"
        error = ("runtime", "ZeroDivisionError: division by zero") if i < failed else None
        entry.record(outcome, 1, 0.0, error)
    return entry


class RefusingWriter(LibraryWriter):
    """The library, except that names in `refuse` come back refused."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse

    def write(self, names, family, feedback=None):
        return [
            Draft(name, None, "library", "refused by the test")
            if name in self.refuse
            else admit(name, skill_source(name), "library")
            for name in names
        ]


def test_slots_keep_carried_actions_and_take_new_ones_where_actions_left(tmp_path: Path) -> None:
    loop = OuterLoop(FAMILY, RandomChooser(0), LibraryWriter(), 3, folder=tmp_path)
    first = loop.begin()
    slots = list(first.sources)
    assert len(slots) == 3 and all(first.origins[name] == "library" for name in slots)
    assert all(first.sources[name] == skill_source(name) for name in slots)
    assert (tmp_path / "iteration_000.json").exists()
    # slot 1 unused (dropped), the others used without failure (kept)
    feedback = loop.review({slots[0]: stats(6), slots[1]: stats(0), slots[2]: stats(7)}, 100)
    assert [report.verdict for report in feedback.actions.values()] == ["keep", "drop", "keep"]
    second = loop.begin(start_frames=100, feedback=feedback)
    after = list(second.sources)
    assert after[0] == slots[0] and after[2] == slots[2] and after[1] not in slots
    assert slot_changes(slots, after) == [1]
    assert second.start_frames == 100 and slots[1] in second.left_to_rl  # dropped: left to RL
    saved = load_iterations(tmp_path)
    assert [it.index for it in saved] == [0, 1]
    assert saved[0].end_frames == 100 and saved[0].decisions[slots[1]].verdict == "drop"


def test_refused_names_are_replaced_by_asking_the_chooser_again() -> None:
    chooser = RandomChooser(3)
    first = OuterLoop(FAMILY, RandomChooser(3), LibraryWriter(), 3).begin()
    refuse = {list(first.sources)[0]}  # the name the same draw would code first
    loop = OuterLoop(FAMILY, chooser, RefusingWriter(refuse), 3)
    iteration = loop.begin()
    assert len(iteration.sources) == 3 and not refuse & set(iteration.sources)
    assert iteration.refused == dict.fromkeys(refuse, "refused by the test")


def test_a_first_iteration_that_cannot_fill_its_slots_is_an_error() -> None:
    with pytest.raises(ValueError, match="fewer than codeact.num_actions=40"):
        OuterLoop(FAMILY, RandomChooser(0), LibraryWriter(), 40).begin()


def test_a_slot_nothing_can_replace_keeps_its_action() -> None:
    family = MissionFamily(
        "BabyAI-GoToRedBallNoDists-v0", ("go to the red ball",), FAMILY.action_words
    )
    slots = len(candidate_actions(family))  # as many slots as candidates
    loop = OuterLoop(family, RandomChooser(0), LibraryWriter(), slots)
    slots = list(loop.begin().sources)
    feedback = loop.review({name: stats(0 if i == 0 else 5) for i, name in enumerate(slots)}, 10)
    assert list(loop.begin(feedback=feedback).sources) == slots


def test_frames_are_primitive_steps_in_the_vector_env_and_its_episodes() -> None:
    sandbox = Sandbox(babyai_text.make("BabyAI-GoToLocal-v0").action_words)
    coded = {"explore": skill_source("explore"), "go to the ball": skill_source("go to the ball")}
    try:
        envs = babyai_text.TextVectorEnv(
            "BabyAI-GoToLocal-v0",
            3,
            seed=5,
            wrapper=lambda env: CodedActionsEnv(env, coded, sandbox, max_steps_per_action=6),
        )
        envs.reset()
        counted, lengths, running = 0, [], [0, 0, 0]
        for t in range(40):
            _, _, _, _, infos = envs.step([6 + (t + i) % 2 if t % 3 else 2 for i in range(3)])
            for i, info in enumerate(infos):
                steps = (info["final_info"] if "episode" in info else info)["primitive_steps"]
                counted += steps
                running[i] += steps
                if "episode" in info:
                    lengths.append((info["episode"]["length"], running[i]))
                    running[i] = 0
        assert envs.frames == counted > 40 * 3  # coded actions took several steps each
        assert lengths and all(length == steps for length, steps in lengths)
    finally:
        sandbox.close()


# ---- a real run, its chooser and code writer behind a server on 127.0.0.1 ---------------------

FAILING = "def step(view, memory):\n    return 1 // 0\n"
TURNS = (
    "def step(view, memory):\n    if view['steps'] >= 2:\n        return 'done'\n"
    "    return 'turn left'\n"
)
CRITIC_ANSWER = (
    "Verdicts:\n"
    "- explore: keep: it finishes and the agent uses it\n"
    "- go to the red ball: REWRITE - it divides by zero\n"
    "pick up the red ball: I am not sure\n"
)
ANSWERS = {
    "The coded actions after this phase": CRITIC_ANSWER,
    "Candidate sub-actions": "go to the red ball\nexplore\npick up the red ball\n",
    '"go to the red ball"': f"Here it is:\n```python\n{FAILING}```\n",
    '"explore"': f"```python\n{TURNS}```",
    '"pick up the red ball"': f"```python\n{TURNS}```",
}


class ScriptedChat:
    """A code-writing model as `ChatServer` serves it: the first answer whose key is in the
    question."""

    model_id = "scripted"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def generate(self, conversations, *, temperature, max_tokens, seeds=None):  # noqa: ANN001, ANN201
        completions = []
        for messages in conversations:
            question = messages[-1]["content"]
            self.asked.append(question)
            text = next(answer for key, answer in ANSWERS.items() if key in question)
            completions.append(Completion(text, "stop", len(question), len(text)))
        return completions


@pytest.fixture(scope="module")
def chat_server() -> Iterator[tuple[ScriptedChat, str]]:
    scripted = ScriptedChat()
    with ChatServer(scripted, port=0) as server:  # type: ignore[arg-type]
        server.start()
        yield scripted, server.url


def codeact_overrides(run: Path, *extra: str, total_frames: int = 384) -> list[str]:
    """A run of 3 phases of 128 frames on GoToRedBallNoDists, 2 coded actions (a few seconds)."""
    return [
        *SMALL_SYMBOLIC,
        "env.name=BabyAI-GoToRedBallNoDists-v0",
        "codeact.num_actions=2",
        "codeact.iterations=3",
        "codeact.phase_frames=128",
        "codeact.min_uses=1",
        "codeact.max_steps_per_action=8",
        "codeact.family_episodes=2",
        f"train.total_frames={total_frames}",
        f"train.output_dir={run}",
        *extra,
    ]


def run_codeact(run: Path, *overrides: str, total_frames: int = 384) -> list[dict[str, str]]:
    cfg = compose_run(
        "codeact_symbolic", codeact_overrides(run, *overrides, total_frames=total_frames)
    )
    hooks = coupling_hooks(cfg)
    policy = coupling_policy_factory(cfg, build_symbolic_policy, hooks)
    train(cfg, Accelerator(cpu=True), run, make_policy=policy, hooks=hooks)
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def chat_run(
    chat_server: tuple[ScriptedChat, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, str]], ScriptedChat]:
    scripted, url = chat_server
    run = tmp_path_factory.mktemp("codeact") / "run"
    rows = run_codeact(
        run,
        "codeact.chooser=chat",
        "codeact.writer=chat",
        f"codeact.base_url={url}",
        "codeact.timeout=30",
        "codeact.max_retries=0",
    )
    return run, rows, scripted


def test_generated_code_fails_is_rewritten_once_then_dropped_and_its_slot_refilled(
    chat_run,
) -> None:
    run, _, scripted = chat_run
    first, second, third = load_iterations(run / "codeact")
    assert list(first.sources) == ["go to the red ball", "explore"]
    assert first.chooser == "chat" and set(first.origins.values()) == {"generated"}
    assert first.sources["go to the red ball"] == FAILING
    assert first.decisions["go to the red ball"].verdict == "rewrite"
    assert "ZeroDivisionError" in first.decisions["go to the red ball"].reason
    assert first.decisions["explore"].verdict == "keep"
    # the writer was asked again, told the error; the new code fails the same way
    rewrite = [q for q in scripted.asked if "Your previous version failed" in q]
    assert rewrite and "ZeroDivisionError" in rewrite[0] and '"go to the red ball"' in rewrite[0]
    assert second.rewritten == ["go to the red ball"]
    assert list(second.sources) == ["go to the red ball", "explore"]  # same slots
    assert second.decisions["go to the red ball"].verdict == "drop"
    # its slot takes the chooser's next candidate; explore keeps its slot
    assert list(third.sources) == ["pick up the red ball", "explore"]
    assert third.sources["pick up the red ball"] == TURNS
    assert third.decisions and third.end_frames is not None  # the last phase is reviewed too
    assert [first.start_frames, second.start_frames, third.start_frames] == [
        0,
        first.end_frames,
        second.end_frames,
    ]


def test_the_run_counts_primitive_frames_and_reports_the_coded_actions(chat_run) -> None:
    run, rows, _ = chat_run
    decisions = 4 * 16  # env.num_envs x ppo.frames_per_env
    frames = [int(row["frames"]) for row in rows]
    steps = [b - a for a, b in zip([0, *frames], frames, strict=False)]
    for row, step in zip(rows, steps, strict=True):
        # the trainer counts the vector env's frames, the hook the coded actions' statistics
        assert step == pytest.approx(float(row["codeact/frames_per_decision"]) * decisions)
        assert 0 < float(row["codeact/coded_share"]) <= 1
    assert all(step > decisions for step in steps)  # coded actions took several frames
    failing = [float(row["codeact/failure_rate"]) for row in rows]
    assert failing[0] > 0 and not math.isnan(failing[0])
    assert [row["codeact/iteration"] for row in rows][0] == "0.0"
    assert sum(float(row["codeact/slots_changed"]) for row in rows) == 1  # the dropped one
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["codeact"]["chooser"] == "chat"


def test_a_resumed_run_takes_the_iteration_of_its_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_codeact(run, "codeact.chooser=random", total_frames=200)  # ends in phase 1
    saved = load_iterations(run / "codeact")
    assert [it.index for it in saved] == [0, 1] and saved[1].end_frames is not None
    run_codeact(run, "codeact.chooser=random", "train.resume=true", total_frames=900)
    resumed = load_iterations(run / "codeact")
    assert [it.index for it in resumed] == [0, 1, 2]
    assert (
        resumed[1].sources == saved[1].sources and resumed[1].start_frames == saved[1].start_frames
    )
    assert resumed[2].end_frames is not None


def test_the_config_refuses_coded_actions_where_they_cannot_join() -> None:
    with pytest.raises(ValueError, match="codeact.chooser='random': coded actions join"):
        compose_run("codeact_symbolic", ["codeact.chooser=random", "teach.teacher=uniform"])
    with pytest.raises(ValueError, match="codeact.chooser"):
        compose_run("codeact_symbolic", ["codeact.chooser=smart"])
    with pytest.raises(ValueError, match="codeact.num_actions"):
        compose_run("codeact_symbolic", ["codeact.num_actions=0"])
    with pytest.raises(ValueError, match="codeact.critic='gpt'"):
        compose_run("codeact_symbolic", ["codeact.critic=gpt"])
    assert compose_run("codeact_symbolic").codeact.critic == "rules"  # the default
    assert coupling_hooks(compose_run("codeact_symbolic", ["codeact.chooser=none"])) == []


def test_a_level_too_small_for_the_slots_stops_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="fewer than codeact.num_actions=9"):
        run_codeact(tmp_path / "run", "codeact.chooser=random", "codeact.num_actions=9")


@pytest.mark.slow
def test_two_processes_share_one_outer_loop(tmp_path: Path) -> None:
    """A real 2-process `accelerate launch`: both processes' envs are reviewed together and
    play the same action sets (world size read back from the run's own record)."""
    run = tmp_path / "run"
    overrides = codeact_overrides(run, "codeact.chooser=random")
    command = [
        *accelerate_launch("multi_cpu", 2),
        str(ROOT / "scripts" / "train_baseline.py"),
        "--config-name",
        "codeact_symbolic",
        *overrides,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["launch"]["world_size"] == 2
    iterations = load_iterations(run / "codeact")
    assert [it.index for it in iterations] == [0, 1, 2]
    assert all(it.end_frames is not None for it in iterations)
    uses = sum(entry["uses"] for it in iterations for entry in it.stats.values())
    assert uses > 0
    assert not list(run.glob("codeact/*rank*"))  # one record, written by the main process
    assert json.loads((run / "codeact" / "iteration_000.json").read_text())["chooser"] == "random"


def test_feedback_for_the_chooser_excludes_refused_rewrites() -> None:
    """A rewrite whose new code is refused is not asked for again in the same iteration."""
    loop = OuterLoop(FAMILY, RandomChooser(1), LibraryWriter(), 2, rules=CriticRules(min_uses=1))
    slots = list(loop.begin().sources)
    loop.current.origins[slots[0]] = "generated"  # as if a chat model had written it
    feedback = loop.review({slots[0]: stats(3, failed=3), slots[1]: stats(3)}, 50)
    assert feedback.actions[slots[0]].verdict == "rewrite"
    loop.writer = RefusingWriter({slots[0]})
    second = loop.begin(feedback=feedback)
    assert slots[0] not in second.sources and second.refused == {slots[0]: "refused by the test"}
    assert list(second.sources)[1] == slots[1] and isinstance(feedback, Feedback)


# ---- the evaluation harness plays a checkpoint with its coded actions ------------------------


def test_the_harness_plays_a_checkpoint_with_its_runs_coded_actions(chat_run, tmp_path) -> None:
    run, _, _ = chat_run
    agent = AgentConfig(kind="checkpoint", path=str(run))
    eval_cfg = EvalConfig(
        level="BabyAI-GoToRedBallNoDists-v0",
        suites=["no_change"],
        episodes=6,
        num_envs=3,
        progress_bar=False,
        output_dir=str(tmp_path / "eval"),
    )
    results, paths = evaluate(PostTrainingTestsConfig(agent=agent, eval=eval_cfg))
    episodes = [json.loads(line) for line in paths["episodes"].read_text().splitlines()]
    figures = results["suites"]["no_change"]["agent_figures"]
    assert figures["codeact/decisions"] == sum(e["length"] for e in episodes)
    assert figures["codeact/frames"] == sum(e["codeact/frames"] for e in episodes)
    assert figures["codeact/frames"] >= figures["codeact/decisions"]
    assert figures["codeact/failed"] == 0  # the last iteration's actions do not fail
    # a policy folder copied away from its run cannot find its coded actions
    alone = tmp_path / "alone"
    shutil.copytree(latest_checkpoint(run), alone / "checkpoint")
    with pytest.raises(CheckpointError, match="no iteration saved in"):
        evaluate(
            PostTrainingTestsConfig(
                agent=AgentConfig(kind="checkpoint", path=str(alone / "checkpoint")),
                eval=dataclasses.replace(eval_cfg, output_dir=str(alone / "eval")),
            )
        )


def test_a_fixed_chooser_codes_the_listed_names_in_order_any_skill_allowed() -> None:
    names = ["open the door", "go to the object in the mission", "pick up a key"]
    loop = OuterLoop(FAMILY, FixedChooser(names), LibraryWriter(), 2)
    first = loop.begin()
    assert list(first.sources) == names[:2] and first.chooser == "fixed"  # not candidates
    assert first.left_to_rl == names[2:]
    feedback = loop.review({names[0]: stats(0), names[1]: stats(4)}, 10)  # the door unused
    assert list(loop.begin(feedback=feedback).sources) == ["pick up a key", names[1]]
    with pytest.raises(ValueError, match="codeact.actions lists the sub-actions"):
        compose_run("codeact_symbolic", ["codeact.chooser=fixed"])
    with pytest.raises(ValueError, match="codeact.actions lists the sub-actions"):
        compose_run("codeact_symbolic", ["codeact.actions=[explore]"])


def test_a_language_model_policy_scores_the_coded_actions_names(tmp_path: Path) -> None:
    """Any policy of the trainer: the tiny language-model preset scores the names as text; a new
    iteration's names reach its candidates."""
    cfg = compose_run(
        "tiny",
        [
            "env.name=BabyAI-GoToRedBallNoDists-v0",
            "env.action_space=default",
            "codeact.chooser=random",
            "codeact.num_actions=2",
            "codeact.iterations=2",
            "codeact.phase_frames=16",
            "codeact.min_uses=1",
            "codeact.family_episodes=2",
            "env.num_envs=2",
            "ppo.frames_per_env=8",
            "ppo.minibatch_size=16",
            "ppo.epochs=1",
            "train.total_frames=48",
            "train.progress_bar=false",
            f"train.output_dir={tmp_path}",
        ],
    )
    hooks = coupling_hooks(cfg)
    training = {}

    class Spy(TrainerHook):
        def start(self, t) -> None:  # noqa: ANN001
            training["t"] = t

    train(
        cfg,
        Accelerator(cpu=True),
        tmp_path,
        make_policy=coupling_policy_factory(cfg, build_policy, hooks),
        hooks=[*hooks, Spy()],
    )
    iterations = load_iterations(tmp_path / "codeact")
    assert len(iterations) == 2 and all(it.end_frames is not None for it in iterations)
    t = training["t"]
    words = [*t.runner.action_words[:6], *iterations[-1].sources]
    assert t.runner.action_words == words == t.model.action_words
    assert t.runner.candidates()[0] == words


def test_the_critic_drops_an_action_that_never_achieves_anything() -> None:
    """A box behind a locked door: every execution stops at its step limit, without reward."""
    stuck, earning, rare = CodedActionStats(), CodedActionStats(), CodedActionStats()
    for _ in range(6):
        stuck.record("step_limit", 32, 0.0, None)
        earning.record("episode_end", 3, 0.9, None)  # the mission done inside the execution
    rare.record("step_limit", 32, 0.0, None)  # too few uses to judge
    decisions = judge({"stuck": stuck, "earning": earning, "rare": rare}, CriticRules(min_uses=5))
    assert decisions["stuck"].verdict == "drop"
    assert decisions["stuck"].reason == (
        "never finished nor earned a reward in 6 uses (step_limit 6)"
    )
    assert decisions["earning"].verdict == decisions["rare"].verdict == "keep"


def test_a_dropped_name_is_never_proposed_again_nor_after_a_resume() -> None:
    names = ["explore", "go to the object in the mission", "pick up a key", "open the door"]
    loop = OuterLoop(FAMILY, FixedChooser(names), LibraryWriter(), 2)
    loop.begin()
    feedback = loop.review({names[0]: stats(0), names[1]: stats(5)}, 10)  # explore unused
    assert list(loop.begin(feedback=feedback).sources) == [names[2], names[1]]
    feedback = loop.review({names[2]: stats(0), names[1]: stats(5)}, 20)  # the key unused
    resumed = OuterLoop(FAMILY, FixedChooser(names), LibraryWriter(), 2)
    resumed.restore(loop.iterations)
    for outer in (loop, resumed):
        # explore, dropped two iterations ago, stays out: the door takes the slot
        assert list(outer.begin(feedback=feedback).sources) == [names[3], names[1]]
    assert set(loop.dropped) == {names[0], names[2]}


# ---- RL-GPT's critic as a chat model (codeact.critic=chat) ------------------------------------


def test_verdicts_are_read_line_by_line_and_the_first_per_name_counts() -> None:
    names = ["explore", "go to the red ball", "go to the red ball twice"]
    said = parse_verdicts(
        "1. Explore: Keep. useful\ngo to the red ball twice - drop: loops\n"
        "go to the red ball: rewrite: errors\nexplore: drop\nnonsense: keep\n",
        names,
    )
    assert said == {
        "explore": ("keep", "useful"),
        "go to the red ball twice": ("drop", "loops"),
        "go to the red ball": ("rewrite", "errors"),
    }


def test_the_chat_critic_decides_through_the_server_and_the_rules_fill_in(
    chat_server: tuple[ScriptedChat, str], tmp_path: Path
) -> None:
    """Against a scripted server: the model's verdicts are taken, a rewrite of library code
    becomes a drop, an action the answer leaves undecided gets the rules' verdict."""
    scripted, url = chat_server
    names = ["explore", "go to the red ball", "pick up the red ball"]
    client = OpenAIChatClient(
        ClientConfig(backend="openai", base_url=url, timeout=30, max_retries=0)
    )
    try:
        critic = ChatCritic(client, FAMILY, seed=1)
        loop = OuterLoop(FAMILY, FixedChooser(names), LibraryWriter(), 3, critic=critic)
        loop.begin()
        asked = len(scripted.asked)
        loop.review({names[0]: stats(6), names[1]: stats(6, failed=6), names[2]: stats(0)}, 10)
    finally:
        client.close()
    question = scripted.asked[asked]
    assert "- go to the red ball: used 6 times, finished 0" in question
    assert "ZeroDivisionError" in question and "cannot be rewritten" in question
    decisions = loop.current.decisions
    assert decisions["explore"] == Decision(
        "keep", "chat critic: it finishes and the agent uses it"
    )
    assert decisions["go to the red ball"].verdict == "drop"  # library code: no rewrite
    assert "rewrite asked, but it cannot be rewritten" in decisions["go to the red ball"].reason
    assert decisions["pick up the red ball"] == Decision(
        "drop", "the chat critic gave no verdict; by the rules: unused over the phase"
    )
    assert loop.current.critic == "chat" and critic.answers == [CRITIC_ANSWER]


def test_a_run_with_the_chat_critic_records_its_verdicts(
    chat_server: tuple[ScriptedChat, str], tmp_path: Path
) -> None:
    """`codeact.critic=chat` in a training run: the hook asks the critic through the client of
    `codeact.base_url` after each phase; the records say who decided."""
    _, url = chat_server
    fixed = "codeact.actions=[explore,go to the red ball]"
    run_codeact(
        tmp_path / "run",
        "codeact.chooser=fixed",
        fixed,
        "codeact.critic=chat",
        f"codeact.base_url={url}",
        "codeact.timeout=30",
        "codeact.max_retries=0",
        total_frames=256,
    )
    reviewed = [it for it in load_iterations(tmp_path / "run" / "codeact") if it.decisions]
    assert reviewed and all(it.critic == "chat" for it in reviewed)
    reasons = [d.reason for it in reviewed for d in it.decisions.values()]
    assert any(reason.startswith("chat critic: ") for reason in reasons)
