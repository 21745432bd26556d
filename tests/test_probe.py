"""GLAM's action-probability probe: the situations read as BabyAI-Text writes them, the right
actions in the run's words, probe.csv on a tiny model, and the plot.

PYTHONPATH=$PWD .venv/bin/python -m pytest tests/test_probe.py -x -q
"""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from helpers_tiny import one_torch_thread, tiny_causal_lm  # noqa: F401
from minigrid.core.grid import Grid
from minigrid.core.world_object import Ball, Box, Key, Wall
from torch import nn

import babyai_text
from babyai_text.describe import describe_env
from glam.config import EnvConfig, PolicyConfig
from glam.policy.llm_policy import LLMActorCritic, PolicyOutput
from glam.policy.prompts import PromptHistory
from glam.probe import (
    PROBE_COLUMNS,
    SITUATIONS,
    ActionProbe,
    Seen,
    build_probes,
    describe_scene,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = EnvConfig(action_space="default", nbr_obs=3)


def _situation(probe_id: str):
    return next(s for s in SITUATIONS if s.id == probe_id)


# ---------------------------------------------------------------------------------------------
# The situations and their prompts
# ---------------------------------------------------------------------------------------------


def test_a_probe_prompt_is_the_glam_prompt_written_out_by_hand() -> None:
    probes = {p.situation.id: p for p in build_probes(DEFAULT, PolicyConfig())}
    assert probes["goto-right-wall-ahead"].prompt == (
        "Possible action of the agent: turn left, turn right, go forward, pick up, drop, toggle\n"
        "Goal of the agent: go to the blue box\n"
        "Observation 0: You see a wall 1 step forward, You see a yellow ball 2 steps left, "
        "You see a blue box 3 steps right,\n"
        "Action 0:"
    )
    assert probes["putnext-drop"].prompt.splitlines()[2] == (
        "Observation 0: You carry a purple key, You see a blue ball 2 steps forward,"
    )
    assert probes["putnext-drop"].candidates[probes["putnext-drop"].right_index] == "drop"


@pytest.mark.parametrize(
    ("env_cfg", "prompt_format"),
    [
        (DEFAULT, "glam"),
        (EnvConfig(action_space="nav", nbr_obs=1), "glam"),
        (EnvConfig(action_space="french", language="fr"), "glam"),
        (DEFAULT, "chat"),
    ],
)
def test_probe_prompts_equal_what_prompt_history_produces(
    env_cfg: EnvConfig, prompt_format: str
) -> None:
    _, tokenizer = tiny_causal_lm()
    policy_cfg = PolicyConfig(prompt_format=prompt_format)
    probes = build_probes(env_cfg, policy_cfg, tokenizer)
    words = babyai_text.get_action_space(env_cfg.action_space).words
    for probe in probes:
        situation = probe.situation
        history = PromptHistory(env_cfg.nbr_obs)
        history.add_observation(
            describe_scene(situation.seen, situation.carrying, env_cfg.language)
        )
        mission = babyai_text.describe.translate_mission(situation.mission, env_cfg.language)
        expected = history.prompt(
            mission, words, env_cfg.language, prompt_format=prompt_format, tokenizer=tokenizer
        )
        assert probe.prompt == expected
        assert probe.candidates == words
    if env_cfg.language == "fr":
        drop = next(p for p in probes if p.situation.id == "putnext-drop")
        assert "But de l'agent: mets la clé violette à côté de la balle bleue" in drop.prompt
        assert "Tu portes une clé violette, Tu vois une balle bleue à 2 pas devant," in drop.prompt
        assert drop.candidates[drop.right_index] == "lâcher"


def _place_agent_facing_up(env, x: int, y: int, size: int = 11) -> None:
    """An empty walled room with the agent at (x, y) facing up (minigrid direction 3)."""
    base = env.unwrapped
    base.grid = Grid(size, size)
    base.grid.wall_rect(0, 0, size, size)
    base.agent_pos, base.agent_dir, base.carrying = (x, y), 3, None


def test_scenes_read_as_the_env_writes_the_same_room() -> None:
    """Put a scene's objects in a real minigrid room around the agent: BabyAI-Text's describer of
    the env says what `describe_scene` says (offsets, walls, the carried object)."""
    env = babyai_text.make("BabyAI-GoToRedBallNoDists-v0")
    env.reset(seed=0)
    # goto-right-wall-ahead: a wall across the view 1 step ahead, a ball 2 left, a box 3 right.
    _place_agent_facing_up(env, 5, 6)
    grid = env.unwrapped.grid
    for x in range(1, 10):
        grid.set(x, 5, Wall())
    grid.set(3, 6, Ball("yellow"))
    grid.set(8, 6, Box("blue"))
    situation = _situation("goto-right-wall-ahead")
    assert describe_env(env) == describe_scene(situation.seen)
    # putnext-drop: carrying the purple key, the blue ball 2 steps ahead.
    _place_agent_facing_up(env, 5, 8)
    env.unwrapped.grid.set(5, 6, Ball("blue"))
    env.unwrapped.carrying = Key("purple")
    situation = _situation("putnext-drop")
    assert describe_env(env) == describe_scene(situation.seen, situation.carrying)
    assert describe_scene(situation.seen, situation.carrying)[0] == "You carry a purple key"


def test_scene_outside_the_view_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the 7x7 view"):
        describe_scene([Seen("ball", "red", 4, 1)])


def test_situations_cover_four_task_types_and_avoid_held_out_pairs() -> None:
    by_type = defaultdict(list)
    for situation in SITUATIONS:
        by_type[situation.task_type].append(situation.right_action)
    assert sorted(by_type) == ["goto", "open", "pickup", "putnext"]
    assert all(len(actions) >= 3 for actions in by_type.values())
    assert len({s.id for s in SITUATIONS}) == len(SITUATIONS)
    held_out = ("yellow box", "red key", "red door", "green ball", "grey door")
    for situation in SITUATIONS:
        assert not any(pair in situation.mission for pair in held_out), situation.id


def test_right_actions_are_in_the_words_of_the_run_and_missing_ones_left_out() -> None:
    default = build_probes(DEFAULT, PolicyConfig())
    nav = build_probes(EnvConfig(action_space="nav"), PolicyConfig())
    renamed = {
        p.situation.id: p for p in build_probes(EnvConfig(action_space="renamed"), PolicyConfig())
    }
    assert len(default) == len(SITUATIONS) == 16
    # nav has no pick up, drop or toggle: those five situations are left out.
    assert len(nav) == 11
    assert {p.candidates[p.right_index] for p in nav} == {"turn left", "turn right", "go forward"}
    assert renamed["open-in-front"].candidates[renamed["open-in-front"].right_index] == "switch"
    assert renamed["goto-left"].candidates[renamed["goto-left"].right_index] == "rotate left"


# ---------------------------------------------------------------------------------------------
# ActionProbe
# ---------------------------------------------------------------------------------------------


def _read_probe_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        assert tuple(reader.fieldnames) == PROBE_COLUMNS
        return list(reader)


def test_probe_on_a_tiny_model_writes_probe_csv(tmp_path: Path) -> None:
    model, tokenizer = tiny_causal_lm()
    words = babyai_text.get_action_space("default").words
    policy = LLMActorCritic(model, tokenizer, PolicyConfig(temperature=1.0), words)
    policy.train()
    probe = ActionProbe(tmp_path, 2, DEFAULT, PolicyConfig(temperature=1.0), tokenizer, True)

    assert probe.after_update(1, policy) == {}
    assert not (tmp_path / "probe.csv").exists()  # a skipped update writes nothing
    metrics = probe.after_update(2, policy)
    assert policy.training  # the probe restores the mode it found
    rows = _read_probe_csv(tmp_path / "probe.csv")
    assert len(rows) == 16 * 6
    with torch.no_grad():
        policy.eval()
        expected = policy([p.prompt for p in probe.probes], [list(words)] * 16).dist.probs
    per_probe = defaultdict(list)
    for row in rows:
        per_probe[row["probe"]].append(row)
    right_by_type = defaultdict(list)
    for i, p in enumerate(probe.probes):
        probe_rows = per_probe[p.situation.id]
        assert [r["action"] for r in probe_rows] == list(words)
        probabilities = [float(r["probability"]) for r in probe_rows]
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-6)
        assert probabilities == pytest.approx(expected[i].tolist(), abs=1e-6)
        assert [r["is_right"] for r in probe_rows].count("True") == 1
        right = next(r for r in probe_rows if r["is_right"] == "True")
        assert right["action"] == p.candidates[p.right_index]
        assert {r["update"] for r in probe_rows} == {"2"}
        right_by_type[p.situation.task_type].append(float(right["probability"]))
    all_right = [v for values in right_by_type.values() for v in values]
    assert metrics["probe/right_action_prob"] == pytest.approx(sum(all_right) / 16, abs=1e-6)
    for task_type, values in right_by_type.items():
        key = f"probe/right_action_prob/{task_type}"
        assert metrics[key] == pytest.approx(sum(values) / len(values), abs=1e-6)
    assert sorted(metrics) == sorted(probe.metric_names)
    # A random model is not uniform: the probe reads the model, not a constant.
    assert not all(abs(v - 1 / 6) < 1e-3 for v in all_right)

    assert probe.after_update(3, policy) == {}
    assert len(_read_probe_csv(tmp_path / "probe.csv")) == 96
    probe.after_update(4, policy)
    rows = _read_probe_csv(tmp_path / "probe.csv")
    assert [r["update"] for r in rows].count("4") == 96 and len(rows) == 192


class _KnownPolicy(nn.Module):
    """A policy that gives the right action 3 times the weight of each other action (the right
    action is looked up by prompt), and counts its forward passes."""

    def __init__(self, right: dict[str, str]) -> None:
        super().__init__()
        self.right = right
        self.calls = 0

    def forward(self, prompts: list[str], candidates: list[list[str]]) -> PolicyOutput:
        self.calls += 1
        logits = torch.zeros(len(prompts), len(candidates[0]))
        for i, (prompt, actions) in enumerate(zip(prompts, candidates, strict=True)):
            logits[i, actions.index(self.right[prompt])] = torch.log(torch.tensor(3.0))
        mask = torch.ones_like(logits, dtype=torch.bool)
        return PolicyOutput(logits=logits, values=torch.zeros(len(prompts)), mask=mask)


def test_probe_metrics_of_a_known_policy_and_other_processes(tmp_path: Path) -> None:
    env_cfg = EnvConfig(action_space="nav")
    probes = build_probes(env_cfg, PolicyConfig())
    policy = _KnownPolicy({p.prompt: p.candidates[p.right_index] for p in probes})
    main = ActionProbe(tmp_path / "main", 1, env_cfg, PolicyConfig(), None, True)
    other = ActionProbe(tmp_path / "other", 1, env_cfg, PolicyConfig(), None, enabled=False)
    (tmp_path / "main").mkdir()
    (tmp_path / "other").mkdir()
    metrics = main.after_update(5, policy)
    # 3 actions, the right one weighted 3 against 1 + 1: probability 3 / 5.
    assert metrics == pytest.approx(
        {
            "probe/right_action_prob": 0.6,
            "probe/right_action_prob/goto": 0.6,
            "probe/right_action_prob/open": 0.6,
            "probe/right_action_prob/pickup": 0.6,
            "probe/right_action_prob/putnext": 0.6,
        }
    )
    # Another process makes the same forward pass (ZeRO-3 needs it) but writes and returns nothing.
    assert other.after_update(5, policy) == {}
    assert policy.calls == 2
    assert list((tmp_path / "other").iterdir()) == []
    assert other.after_update(6, policy) == {} and policy.calls == 3


def test_a_resumed_run_drops_the_rows_of_the_interrupted_session(tmp_path: Path) -> None:
    env_cfg = EnvConfig(action_space="nav")
    probes = build_probes(env_cfg, PolicyConfig())
    policy = _KnownPolicy({p.prompt: p.candidates[p.right_index] for p in probes})
    first = ActionProbe(tmp_path, 2, env_cfg, PolicyConfig())
    for update in (2, 4, 6):
        first.after_update(update, policy)
    # The run is resumed from the checkpoint of update 3: its probes of 4 and 6 are dropped.
    resumed = ActionProbe(tmp_path, 2, env_cfg, PolicyConfig())
    resumed.after_update(4, policy)
    updates = [r["update"] for r in _read_probe_csv(tmp_path / "probe.csv")]
    assert updates == ["2"] * 33 + ["4"] * 33


@pytest.mark.parametrize(
    ("every", "policy_cfg", "message"),
    [
        (0, PolicyConfig(), "every must be >= 1"),
        (1, PolicyConfig(kind="symbolic"), "policy.kind=symbolic reads the grid"),
    ],
)
def test_bad_probe_settings_are_refused(
    every: int, policy_cfg: PolicyConfig, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        ActionProbe(tmp_path, every, DEFAULT, policy_cfg)


# ---------------------------------------------------------------------------------------------
# scripts/plot_probe.py
# ---------------------------------------------------------------------------------------------


def _plot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_probe.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plot_probe_draws_probe_csv(tmp_path: Path) -> None:
    env_cfg = EnvConfig(action_space="nav")
    probes = build_probes(env_cfg, PolicyConfig())
    policy = _KnownPolicy({p.prompt: p.candidates[p.right_index] for p in probes})
    probe = ActionProbe(tmp_path, 1, env_cfg, PolicyConfig())
    for update in range(1, 4):
        probe.after_update(update, policy)
    done = _plot(str(tmp_path))
    assert done.returncode == 0, done.stderr
    png = tmp_path / "probe.png"
    assert done.stdout.strip() == f"wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("content", [None, ""])
def test_plot_probe_refuses_a_run_without_probes(content: str | None, tmp_path: Path) -> None:
    if content is not None:
        (tmp_path / "probe.csv").write_text(content)
    done = _plot(str(tmp_path))
    assert done.returncode == 2
    assert ("has no probe.csv" if content is None else "probe.csv is empty") in done.stderr
    assert not (tmp_path / "probe.png").exists()


def test_train_probe_every_probes_a_tiny_training_run(tmp_path: Path) -> None:
    """Through the training script: update 0 and every 2nd update probed; metrics.csv has the
    probe's columns on every row, blank between probes."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train_language_agent.py"),
            "--config-name",
            "tiny",
            f"train.output_dir={run_dir}",
            "train.total_frames=192",
            "train.probe_every=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _read_probe_csv(run_dir / "probe.csv")
    assert sorted({int(row["update"]) for row in rows}) == [0, 2]
    with (run_dir / "metrics.csv").open() as file:
        metrics = list(csv.DictReader(file))
    assert [row["probe/right_action_prob"] != "" for row in metrics] == [False, True, False]
    right = [
        float(r["probability"]) for r in rows if r["update"] == "2" and r["is_right"] == "True"
    ]
    assert float(metrics[1]["probe/right_action_prob"]) == pytest.approx(sum(right) / len(right))


def test_the_probe_is_refused_for_a_policy_that_does_not_read_text() -> None:
    from glam.config import TrainConfig
    from glam.run_config import TrainingRunConfig

    with pytest.raises(ValueError, match="train.probe_every=3: the action-probability probe"):
        TrainingRunConfig(policy=PolicyConfig(kind="symbolic"), train=TrainConfig(probe_every=3))
