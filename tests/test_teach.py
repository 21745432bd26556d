"""LLM4Teach in the PPO trainer: the schedule, the distillation term, the teachers, the cache,
and a student that comes to agree with its teacher."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from helpers_couplings import SMALL_SYMBOLIC, WALL_CLOCK_METRICS, CountingScorer
from minigrid.core.actions import Actions
from minigrid.utils.baby_ai_bot import BabyAIBot

import babyai_text
from glam.baselines.symbolic import build_symbolic_policy
from glam.config import PPOConfig
from glam.envs import EnvRunner
from glam.eval.student_agreement import mission_in_view, student_agreement
from glam.ppo.hooks import TrainerHook
from glam.ppo.trainer import train
from glam.ppo.update import _chunk_loss
from glam.run_config import compose_run
from glam.runs.checkpoint import TrainerState
from glam.skills import candidate_subgoals
from glam.teach.config import TeachConfig
from glam.teach.hook import TeachHook, distillation_loss
from glam.teach.scorers import SubgoalScorer
from glam.teach.teacher import BotTeacher, SubgoalTeacher

ROOT = Path(__file__).resolve().parents[1]

# --- The schedule ------------------------------------------------------------------------------


def test_the_authors_schedule_at_chosen_updates() -> None:
    cfg = TeachConfig(teacher="llm")  # 10, -0.005 per update, floor 0.1, off after 3000
    assert cfg.coef(1) == 10.0
    assert cfg.coef(2) == pytest.approx(9.995)
    assert cfg.coef(1001) == pytest.approx(5.0)
    assert cfg.coef(1981) == pytest.approx(0.1)  # 10 - 0.005 * 1980: the floor is reached
    assert cfg.coef(2500) == cfg.coef(3000) == 0.1
    assert cfg.coef(3001) == 0.0 and cfg.coef(10**6) == 0.0
    assert TeachConfig(teacher="none").coef(1) == 0.0


def test_bad_teach_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="teach.teacher='oracle'"):
        TeachConfig(teacher="oracle")
    with pytest.raises(ValueError, match="coef_floor"):
        TeachConfig(teacher="bot", coef_start=0.5, coef_floor=1.0)
    with pytest.raises(ValueError, match="teach.temperature"):
        TeachConfig(teacher="llm", temperature=0.0)
    with pytest.raises(ValueError, match="not into DRRN"):
        compose_run("drrn", ["teach.teacher=bot"])


# --- The distillation term ---------------------------------------------------------------------


def test_distillation_loss_by_hand() -> None:
    # Row 0: student (1/3, 2/3, absent), teacher (1/2, 1/2, 0): CE = (ln 3 + ln 1.5) / 2.
    # Row 1: no advice: adds 0 (but counts in the mean, as PPO's mean over the micro-batch).
    logits = torch.tensor([[0.0, math.log(2.0), -math.inf], [5.0, 0.0, 0.0]])
    teacher = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    valid = torch.tensor([True, False])
    loss, rows = distillation_loss(logits, teacher, valid)
    row0 = (math.log(3.0) + math.log(1.5)) / 2
    assert rows.tolist() == pytest.approx([row0, 0.0])
    assert loss.item() == pytest.approx(row0 / 2)
    # The gradient pulls the student's logits toward the teacher's (softmax - teacher).
    logits.requires_grad_(True)
    distillation_loss(logits, teacher, valid)[0].backward()
    assert logits.grad[0].tolist() == pytest.approx([(1 / 3 - 0.5) / 2, (2 / 3 - 0.5) / 2, 0.0])
    assert logits.grad[1].tolist() == [0.0, 0.0, 0.0]


def _minibatch(seed: int = 0):
    """A symbolic policy and a minibatch of 8 grid transitions with a teacher's tensors."""
    from glam.ppo.buffer import Transitions

    cfg = compose_run("symbolic_ppo", SMALL_SYMBOLIC)
    torch.manual_seed(seed)
    policy = build_symbolic_policy(cfg, None)
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=8, seed=123, observation_kind="grid")
    runner.reset()
    observations = runner.observations()
    runner.close()
    teacher = torch.softmax(torch.randn(8, 3), -1)
    batch = Transitions(
        observations=observations,
        actions=torch.randint(3, (8,)),
        logprobs=torch.full((8,), -1.1),
        values=torch.zeros(8),
        advantages=torch.randn(8),
        returns=torch.randn(8),
        extras={"teacher_probs": teacher, "teacher_valid": torch.rand(8) > 0.3},
    )
    return policy, batch


def _hook(update: int, **teach: object) -> TeachHook:
    hook = TeachHook(TeachConfig(**teach), teacher=SimpleNamespace())
    hook.training = SimpleNamespace(state=TrainerState(update=update))
    return hook


def test_with_coefficient_zero_the_loss_is_ppos_exactly() -> None:
    ppo = PPOConfig()
    policy, batch = _minibatch()

    def loss_and_grads(hooks: tuple[TrainerHook, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        policy.zero_grad()
        loss, _ = _chunk_loss(policy, batch, ppo, torch.device("cpu"), hooks)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in policy.parameters() if p.grad is not None]

    plain, plain_grads = loss_and_grads(())
    # Past `off_after` (update 3 of a schedule that ends after 2): nothing is added.
    off, off_grads = loss_and_grads((_hook(2, teacher="bot", off_after=2),))
    assert torch.equal(off, plain)
    assert all(torch.equal(a, b) for a, b in zip(off_grads, plain_grads, strict=True))
    # While on: PPO's loss plus coef * the distillation term, nothing else.
    on, _ = loss_and_grads((_hook(0, teacher="bot", coef_start=2.5, off_after=5),))
    with torch.no_grad():
        output = policy(**batch.observations.inputs())
        term, _ = distillation_loss(
            output.logits, batch.extras["teacher_probs"], batch.extras["teacher_valid"]
        )
    assert on.item() == pytest.approx(plain.item() + 2.5 * term.item(), rel=1e-6)
    assert term.item() > 0.1


# --- The trainer with and without a teacher ---------------------------------------------------


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as file:
        return list(csv.DictReader(file))


def test_an_inactive_teacher_leaves_the_run_bit_identical(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    runs = {}
    for name, hooks in (
        ("plain", ()),
        ("off", (TeachHook(TeachConfig(teacher="bot", off_after=0)),)),
    ):
        cfg = compose_run("symbolic_ppo", [*SMALL_SYMBOLIC, f"train.output_dir={tmp_path / name}"])
        train(cfg, accelerator, tmp_path / name, make_policy=build_symbolic_policy, hooks=hooks)
        runs[name] = _metrics(tmp_path / name)
    assert len(runs["plain"]) == 3
    for plain, off in zip(runs["plain"], runs["off"], strict=True):
        assert off["teach/coef"] == "0.0" and off["teach/llm_calls"] == "0.0"
        for key, value in plain.items():
            if not key.startswith(WALL_CLOCK_METRICS):
                assert off[key] == value, key


# --- The teachers ------------------------------------------------------------------------------


def test_the_cache_answers_repeated_situations_without_the_model() -> None:
    scorer = CountingScorer()
    teacher = SubgoalTeacher([0, 1, 2], scorer, temperature=2.0)
    probs = teacher.subgoal_probabilities(
        ["A", "B", "A"], [["x", "y"], ["x", "y", "z"], ["x", "y"]]
    )
    assert scorer.asked == [["A", "B"]]  # a situation twice in one batch is scored once
    assert probs[0].tolist() == pytest.approx(torch.softmax(torch.tensor([0.0, 0.5]), 0).tolist())
    assert torch.equal(probs[0], probs[2])
    counts = teacher.pop_counts()
    assert (counts.llm_calls, counts.cache_hits) == (2, 0)
    again = teacher.subgoal_probabilities(["B", "A"], [["x", "y", "z"], ["x", "y"]])
    assert scorer.asked == [["A", "B"]]  # nothing new asked
    assert torch.equal(again[1], probs[0]) and torch.equal(again[0], probs[1])
    counts = teacher.pop_counts()
    assert (counts.llm_calls, counts.cache_hits) == (0, 2)
    # The same text with other candidates (a closed door reads as an open one) is asked anew.
    other = teacher.subgoal_probabilities(["A"], [["x", "y", "open"]])
    assert scorer.asked[-1] == ["A"] and len(other[0]) == 3
    uncached = SubgoalTeacher([0, 1, 2], scorer, cache=False)
    uncached.subgoal_probabilities(["A"], [["x", "y"]])
    uncached.subgoal_probabilities(["A"], [["x", "y"]])
    assert scorer.asked[2:] == [["A"], ["A"]]


class MissionScorer(SubgoalScorer):
    """All the weight on the subgoal the mission names ("go to the red ball")."""

    def log_likelihoods(self, prompts, candidates):  # noqa: ANN001, ANN201
        missions = [
            p.split("\n")[0].removeprefix("Goal: ").replace("go to a ", "go to the ")
            for p in prompts
        ]
        return [
            torch.tensor([0.0 if c == m else -50.0 for c in cands])
            for m, cands in zip(missions, candidates, strict=True)
        ]


def test_a_teacher_sure_of_the_mission_s_subgoal_advises_the_bot_s_action() -> None:
    checked = 0
    for seed in range(12):
        env = babyai_text.make("BabyAI-GoToLocal-v0")
        env.reset(seed=seed)
        subgoal = env.unwrapped.mission.replace("go to a ", "go to the ")
        if subgoal not in candidate_subgoals(env.unwrapped):
            continue  # the target is not in view: the bot explores
        space = env.action_space_def.minigrid_actions
        probs, valid = SubgoalTeacher(space, MissionScorer()).distributions([env], [0], [True])
        bot_probs, bot_valid = BotTeacher(space).distributions([env], [0], [True])
        assert valid.tolist() == bot_valid.tolist() == [True]
        assert probs.max() > 0.999  # the mission's subgoal has e^50 times the others' weight
        assert probs.argmax() == bot_probs.argmax()
        checked += 1
    assert checked >= 4


def test_the_bot_teacher_replans_after_the_agent_s_own_action() -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    env.reset(seed=3)
    space = list(env.action_space_def.minigrid_actions)
    left, right = space.index(Actions.left), space.index(Actions.right)
    teacher = BotTeacher(space)
    for step in range(6):  # the agent turns away from the advice each time
        # On a walk the bot keeps its plan after a turn: its advice is a fresh bot's.
        fresh = BabyAIBot(env.unwrapped).replan()
        probs, valid = teacher.distributions([env], [0], [step == 0])
        assert valid.item() and space[int(probs.argmax())] == int(fresh)
        other = right if int(probs.argmax()) == left else left
        env.step(other)
        teacher.record_actions([0], [other])


def test_mission_in_view_is_whether_the_agent_sees_the_named_object() -> None:
    env = babyai_text.make("BabyAI-GoToRedBallNoDists-v0")
    env.reset(seed=0)
    base = env.unwrapped
    ((x, y),) = base.instrs.desc.obj_poss  # the red ball, alone in the room
    # One cell beside the ball, facing it (east: dir 0, west: dir 2), then facing away.
    base.agent_pos, toward = ((x - 1, y), 0) if x > 1 else ((x + 1, y), 2)
    base.agent_dir = toward
    assert mission_in_view(env) is True
    base.agent_dir = (toward + 2) % 4
    assert mission_in_view(env) is False
    put_next = babyai_text.make("BabyAI-PutNextLocal-v0")
    put_next.reset(seed=0)
    assert mission_in_view(put_next) is None  # two objects named: no single one


# --- Learning from a teacher -------------------------------------------------------------------


def test_a_bot_teacher_makes_the_student_agree_with_the_bot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [
        "env.name=BabyAI-GoToRedBallNoDists-v0",
        "env.num_envs=8",
        "ppo.frames_per_env=32",
        "train.total_frames=4096",
        "train.progress_bar=false",
        "train.seed=1",
        "train.torch_threads=1",
    ]
    agreement, policies = {}, {}
    for name, teach in (("plain", None), ("taught", TeachConfig(teacher="bot", coef_decay=0.0))):
        cfg = compose_run("symbolic_ppo", [*overrides, f"train.output_dir={tmp_path / name}"])

        def make_policy(cfg, resume_from, name=name):  # noqa: ANN001, ANN202
            policies[name] = build_symbolic_policy(cfg, resume_from)
            return policies[name]

        hooks = (TeachHook(teach),) if teach else ()
        train(cfg, Accelerator(cpu=True), tmp_path / name, make_policy=make_policy, hooks=hooks)
        held_out = student_agreement(
            policies[name].eval(), cfg.env, cfg.policy, seed=10**6, greedy=True
        )
        agreement[name] = held_out.rate
    rows = _metrics(tmp_path / "taught")
    assert float(rows[0]["teach/coef"]) == 10.0 and float(rows[-1]["teach/states"]) == 256
    # Measured (seed 1): after the same 4096 frames plain PPO's greedy student agrees with the
    # bot on 0.01 of the held-out states, the taught one on 0.91.
    assert agreement["taught"] > 0.85
    assert agreement["taught"] > agreement["plain"] + 0.15

    # The script reads the run folder (its config and newest checkpoint) and measures the same.
    script = importlib.util.spec_from_file_location(
        "bot_agreement", ROOT / "scripts" / "bot_agreement.py"
    )
    module = importlib.util.module_from_spec(script)
    script.loader.exec_module(module)
    out = tmp_path / "agreement"
    args = ["--envs", "8", "--steps", "48", "--greedy", "--out", str(out)]
    assert module.main([str(tmp_path / "taught"), str(tmp_path / "plain"), *args]) == 0
    rows = json.loads((out / "agreement.json").read_text())
    assert [row["level"] for row in rows] == ["BabyAI-GoToRedBallNoDists-v0"] * 2
    assert rows[0]["advised"] <= rows[0]["states"] == 8 * 48
    assert rows[0]["agreement"] > rows[1]["agreement"] + 0.15
    for row in rows:  # the split by the ball in view adds up to the whole
        assert 0 < row["advised_in_view"] < row["advised"]
        in_view, rest = row["advised_in_view"], row["advised"] - row["advised_in_view"]
        total = row["agreement_in_view"] * in_view + row["agreement_out_of_view"] * rest
        assert total == pytest.approx(row["agree"])
    assert "| agreement with the bot (95% Wilson) |" in (out / "agreement.md").read_text()
    assert module.main([str(tmp_path), *args, "--overwrite"]) == 2  # a folder without a config
    assert "is not a run folder with a checkpoint" in capsys.readouterr().err
    assert module.main([str(tmp_path / "taught"), "--level", "BabyAI-Nope-v0"]) == 2
    assert "unknown level 'BabyAI-Nope-v0'" in capsys.readouterr().err


def test_the_student_network_learns_the_bot_s_advice_by_supervised_learning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = importlib.util.spec_from_file_location(
        "imitate_bot", ROOT / "scripts" / "imitate_bot.py"
    )
    module = importlib.util.module_from_spec(script)
    script.loader.exec_module(module)
    out = tmp_path / "imitation"
    args = ["--level", "BabyAI-GoToRedBallNoDists-v0", "--states", "2000", "--test-states", "300"]
    assert module.main([*args, "--epochs", "10", "--image-dim", "16", "--out", str(out)]) == 0
    summary = json.loads((out / "imitation.json").read_text())
    rows = list(csv.DictReader((out / "imitation.csv").read_text().splitlines()))
    assert [int(row["epoch"]) for row in rows] == list(range(1, 11))
    # With the ball in view, a bot that knows only the current view advises as the teaching bot.
    assert summary["view_determined_in_view"] > 0.95
    # Measured (seed 0): always "go forward", the commonest advice, agrees on 0.54 of the held-out
    # states; the fitted network on 0.82 (0.91 with the ball in view).
    majority = max(summary["label_shares"])
    assert summary["final"]["agreement"] > max(0.7, majority + 0.15)
    assert summary["final"]["agreement_in_view"] > 0.8
    assert "| a view-only bot agrees (in view / out) |" in (out / "imitation.md").read_text()
    assert module.main([*args, "--follow", "1.5"]) == 2
    assert module.main(["--level", "BabyAI-Nope-v0"]) == 2
    assert "unknown BabyAI level id 'BabyAI-Nope-v0'" in capsys.readouterr().err
