"""DRRN, the text agent trained from scratch: network, TD math, replay, trainer and script.

- The network: ragged candidates masked, a candidate's Q independent of the others, each
  distinct text encoded once, save/load round trip, damaged folders refused by name.
- The math by hand: TD targets, terminations against time-outs (on the real env's time-out),
  the replay buffer's ring and its saved form, exploration within each row's candidates.
- scripts/train_baseline.py as users run it: a run stopped by SIGTERM (run folder, checkpoint
  layout, policy loads), its resume (frames, rows, seeds, replay, target network, optimizer),
  bad input, and a real two-process launch that records world size 2.
- A seeded learning run on BabyAI-GoToRedBallNoDists-v0 that beats a random policy on the same
  held-out episodes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers_launch import accelerate_launch
from safetensors.torch import load_file

from glam.baselines.config import DRRNConfig
from glam.baselines.drrn import DRRNPolicy
from glam.baselines.drrn_trainer import (
    build_drrn_training,
    explore,
    next_states,
    td_targets,
    train_drrn,
)
from glam.baselines.replay import ReplayBuffer
from glam.config import EnvConfig, PolicyConfig
from glam.envs import EnvRunner
from glam.policy.llm_policy import CheckpointError, PolicyOutput
from glam.ppo.logger import read_metrics
from glam.ppo.rollout import play_episodes
from glam.run_config import compose_run
from glam.runs.checkpoint import check_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_baseline.py"
NAV = ["turn left", "turn right", "go forward"]
PROMPT = (
    "Possible action of the agent: turn left, turn right, go forward\n"
    "Goal of the agent: go to the red ball\n"
    "Observation 0: You see a red ball 2 steps forward,\nAction 0:"
)
OTHER_PROMPT = PROMPT.replace("2 steps forward", "1 step left and 3 steps forward")
FRAMES_PER_ROW = 64
SMALL = [
    "env.num_envs=4",
    f"drrn.log_every={FRAMES_PER_ROW}",
    "drrn.learning_starts=32",
    "drrn.batch_size=16",
    "drrn.updates_per_step=0.25",
    "drrn.target_update_every=1000",  # the target stays the initial network: a resume test
    "drrn.embedding_dim=16",
    "drrn.hidden_dim=32",
]
"""Overrides of the `drrn` preset for runs of a few seconds."""


def small_policy(seed: int = 0) -> DRRNPolicy:
    torch.manual_seed(seed)
    return DRRNPolicy(NAV, embedding_dim=8, hidden_dim=16, vocabulary_buckets=64).eval()


# --------------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def test_ragged_candidates_are_masked_and_the_value_is_the_best_present_q() -> None:
    policy = small_policy()
    output = policy([PROMPT, OTHER_PROMPT], [NAV, ["go forward"]])
    assert isinstance(output, PolicyOutput)
    assert output.logits.shape == (2, 3)
    assert output.mask.tolist() == [[True, True, True], [True, False, False]]
    assert torch.isneginf(output.logits[1, 1:]).all()
    assert torch.isfinite(output.logits[output.mask]).all()
    assert output.values.tolist() == [output.logits[0].max().item(), output.logits[1, 0].item()]
    assert output.dist.probs[1].tolist() == [1.0, 0.0, 0.0]  # absent candidates never drawn
    # None offers the action words to every prompt.
    assert torch.equal(policy([PROMPT], None).logits, policy([PROMPT], [NAV]).logits)


@torch.no_grad()
def test_q_of_a_candidate_depends_on_its_prompt_and_text_only() -> None:
    policy = small_policy()
    alone = policy([PROMPT], [["go forward"]]).logits[0, 0]
    among = policy([OTHER_PROMPT, PROMPT], [NAV, ["turn right", "go forward", "pick up"]])
    assert among.logits[1, 1] == pytest.approx(alone.item(), abs=1e-6)
    # Order and company of the candidates do not matter either.
    reordered = policy([PROMPT], [["go forward", "turn left", "turn right"]]).logits[0]
    straight = policy([PROMPT], [NAV]).logits[0]
    assert reordered[[1, 2, 0]].tolist() == pytest.approx(straight.tolist(), abs=1e-6)
    # The prompt matters: the two prompts get different Q for the same action.
    assert abs(among.logits[0, 2] - among.logits[1, 1]).item() > 1e-4


@torch.no_grad()
def test_each_distinct_text_of_a_batch_is_encoded_once() -> None:
    policy = small_policy()
    rows = {}
    for name in ("state_gru", "action_gru"):
        getattr(policy, name).register_forward_hook(
            lambda module, args, out, name=name: rows.setdefault(name, []).append(len(args[0]))
        )
    policy([PROMPT, OTHER_PROMPT, PROMPT, PROMPT], [NAV, NAV, ["go forward", "pick up"], NAV])
    assert rows == {"state_gru": [2], "action_gru": [4]}  # 2 prompts, 3 nav words + "pick up"


def test_save_and_load_give_the_same_q_values_and_record_the_env(tmp_path: Path) -> None:
    policy = small_policy()
    env = EnvConfig(name="BabyAI-GoToRedBallNoDists-v0", action_space="nav", nbr_obs=1)
    folder = policy.save_pretrained(tmp_path / "policy", training_env=env)
    assert sorted(p.name for p in folder.iterdir()) == ["glam_policy.json", "model.safetensors"]
    meta = json.loads((folder / "glam_policy.json").read_text())
    assert meta["kind"] == "drrn" and meta["action_words"] == NAV
    assert meta["network"] == {"embedding_dim": 8, "hidden_dim": 16, "vocabulary_buckets": 64}
    loaded = DRRNPolicy.from_pretrained(folder).eval()
    assert loaded.training_env["action_space"] == "nav" and loaded.training_env["nbr_obs"] == 1
    with torch.no_grad():
        expected = policy([PROMPT, OTHER_PROMPT], [NAV, NAV[:2]]).logits
        assert torch.equal(loaded([PROMPT, OTHER_PROMPT], [NAV, NAV[:2]]).logits, expected)
    trained = DRRNPolicy.from_pretrained(folder, training_env={"name": "x", "nbr_obs": 3})
    assert trained.training_env == {"name": "x", "nbr_obs": 3}


def _damage(folder: Path, how: str) -> None:
    config, weights = folder / "glam_policy.json", folder / "model.safetensors"
    meta = json.loads(config.read_text())
    if how == "no config":
        config.unlink()
    elif how == "config not json":
        config.write_text("{not json")
    elif how == "llm policy":
        meta.pop("kind")
        config.write_text(json.dumps(meta))
    elif how == "other sizes":
        meta["network"]["hidden_dim"] = 17
        config.write_text(json.dumps(meta))
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif how == "no weights":
        weights.unlink()


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("no config", r"glam_policy.json: file is missing"),
        ("config not json", r"glam_policy.json: not valid JSON"),
        ("llm policy", r"glam_policy.json: a 'llm' policy, not a DRRN one"),
        (
            "other sizes",
            r"model.safetensors: the weights do not load with the network sizes.*size mismatch",
        ),
        ("truncated weights", r"model.safetensors: truncated"),
        ("no weights", r"model.safetensors: file is missing"),
    ],
)
def test_a_damaged_policy_folder_is_refused_naming_the_file(
    tmp_path: Path, how: str, message: str
) -> None:
    folder = small_policy().save_pretrained(tmp_path / "policy")
    _damage(folder, how)
    with pytest.raises(CheckpointError, match=message):
        DRRNPolicy.from_pretrained(folder)


# --------------------------------------------------------------------------------------------
# TD math, replay, exploration
# --------------------------------------------------------------------------------------------


def test_td_targets_bootstrap_everywhere_but_at_terminations() -> None:
    # By hand, gamma 0.9: 1 + 0 (terminated), 0 + 0.9 * 3, 0.5 + 0.9 * 4.
    targets = td_targets(
        torch.tensor([1.0, 0.0, 0.5]),
        torch.tensor([2.0, 3.0, 4.0]),
        torch.tensor([True, False, False]),
        gamma=0.9,
    )
    assert targets.tolist() == pytest.approx([1.0, 2.7, 4.1])


def test_a_time_out_bootstraps_from_its_final_observation() -> None:
    # Env 0 terminated, env 1 timed out (its final observation's prompt), env 2 goes on.
    prompts, terminals = next_states(
        dones=torch.tensor([True, True, False]),
        final_prompts=[None, "final of 1", None],
        next_prompts=["new episode of 0", "new episode of 1", "next of 2"],
    )
    assert prompts == ["new episode of 0", "final of 1", "next of 2"]
    assert terminals.tolist() == [True, False, False]
    targets = td_targets(
        torch.tensor([1.0, 0.0, 0.0]), torch.tensor([5.0, 5.0, 5.0]), terminals, 0.5
    )
    assert targets.tolist() == [1.0, 2.5, 2.5]


def test_the_real_time_out_is_not_terminal() -> None:
    # Turning left forever never reaches the ball: every episode times out at BabyAI's 64 steps.
    env = EnvConfig(name="BabyAI-GoToRedBallNoDists-v0", num_envs=2, action_space="nav")
    runner = EnvRunner(env, PolicyConfig(), num_envs=2, seed=7)
    runner.reset()
    for step in range(1, 65):
        _, dones, episodes = runner.step([0, 0])
        prompts, terminals = next_states(
            torch.as_tensor(dones), runner.final_prompts, runner.prompts()
        )
        assert not terminals.any()
        if step < 64:
            assert not dones.any()
    assert dones.all() and all(episode["length"] == 64 for episode in episodes)
    # They bootstrap from the final observation, not from the next episode's first.
    assert all(
        final.startswith("Possible action") and final != new
        for final, new in zip(prompts, runner.prompts(), strict=True)
    )
    runner.close()


def _add(buffer: ReplayBuffer, *numbers: int) -> None:
    n = len(numbers)
    buffer.add(
        [f"s{k}" for k in numbers],
        [NAV[: 1 + k % 3] for k in numbers],
        torch.tensor([k % 3 for k in numbers]),
        torch.tensor([float(k) for k in numbers]),
        [f"s{k + 1}" for k in numbers],
        [NAV] * n,
        torch.tensor([k % 2 == 0 for k in numbers]),
    )


def test_the_replay_buffer_wraps_around_and_saves_oldest_first(tmp_path: Path) -> None:
    buffer = ReplayBuffer(3)
    _add(buffer, 1, 2)
    assert len(buffer) == 2 and buffer.chronological_slots() == [0, 1]
    _add(buffer, 3, 4, 5)  # 4 and 5 overwrite 1 and 2
    assert len(buffer) == 3 and buffer.position == 2
    assert buffer.prompts == ["s4", "s5", "s3"]
    batch = buffer.select(buffer.chronological_slots())
    assert batch.prompts == ["s3", "s4", "s5"] and batch.next_prompts == ["s4", "s5", "s6"]
    assert batch.rewards.tolist() == [3.0, 4.0, 5.0]
    assert batch.actions.tolist() == [0, 1, 2]
    assert batch.candidates == [NAV[:1], NAV[:2], NAV]
    assert batch.terminals.tolist() == [False, True, False]

    buffer.save(tmp_path)
    restored = ReplayBuffer(3)
    restored.load(tmp_path)
    again = restored.select(restored.chronological_slots())
    assert again.prompts == batch.prompts and again.candidates == batch.candidates
    assert torch.equal(again.terminals, batch.terminals)
    assert torch.equal(again.rewards, batch.rewards)
    smaller = ReplayBuffer(2)  # a resumed run with a smaller drrn.replay_size keeps the newest
    smaller.load(tmp_path)
    assert smaller.select(smaller.chronological_slots()).prompts == ["s4", "s5"]

    sampled = buffer.sample(200)
    assert {int(r) for r in sampled.rewards} == {3, 4, 5}
    for prompt, reward in zip(sampled.prompts, sampled.rewards.tolist(), strict=True):
        assert prompt == f"s{int(reward)}"  # rows stay together


def test_a_damaged_replay_file_is_refused(tmp_path: Path) -> None:
    buffer = ReplayBuffer(4)
    _add(buffer, 1, 2)
    buffer.save(tmp_path)
    tables = json.loads((tmp_path / "replay.json").read_text())
    tables["texts"] = tables["texts"][:1]  # indices now point past the table
    (tmp_path / "replay.json").write_text(json.dumps(tables))
    with pytest.raises(ValueError, match="replay.json: malformed replay buffer"):
        ReplayBuffer(4).load(tmp_path)
    (tmp_path / "replay.safetensors").unlink()
    with pytest.raises(ValueError, match="replay.safetensors is missing"):
        ReplayBuffer(4).load(tmp_path)


def test_exploration_stays_within_each_rows_candidates() -> None:
    rows = torch.tensor([[0.0, 5.0, float("-inf")], [9.0, float("-inf"), float("-inf")]])
    q_values = rows.repeat(1000, 1)  # 1000 draws of each row at once
    mask = torch.isfinite(q_values)
    first, second = slice(0, None, 2), slice(1, None, 2)

    def share_of_action_0(cfg: DRRNConfig, frames: int = 0) -> float:
        actions = explore(q_values, mask, cfg, frames)
        assert set(actions[second].tolist()) == {0}  # the one candidate of the second row
        assert set(actions[first].tolist()) <= {0, 1}
        return (actions[first] == 0).float().mean().item()

    torch.manual_seed(0)
    assert share_of_action_0(DRRNConfig(exploration="epsilon", epsilon_start=0.0)) == 0.0
    uniform = DRRNConfig(exploration="epsilon", epsilon_start=1.0, epsilon_end=1.0)
    assert share_of_action_0(uniform) == pytest.approx(0.5, abs=0.05)
    # Linear decay: halfway, epsilon is 0.5, and half of the random actions are action 0.
    decaying = DRRNConfig(exploration="epsilon", epsilon_decay_frames=100, epsilon_end=0.0)
    assert share_of_action_0(decaying, frames=50) == pytest.approx(0.25, abs=0.05)
    assert share_of_action_0(decaying, frames=100) == 0.0
    # Softmax of [0, 5] / 5: action 0 with probability 1 / (1 + e).
    softmax = DRRNConfig(exploration="softmax", temperature=5.0)
    assert share_of_action_0(softmax) == pytest.approx(1 / (1 + math.e), abs=0.05)


# --------------------------------------------------------------------------------------------
# The script and the trainer
# --------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _command(run_dir: Path, config: str = "drrn") -> list[str]:
    return [sys.executable, str(SCRIPT), "--config-name", config, f"train.output_dir={run_dir}"]


def _train(run_dir: Path, *overrides: str, launcher: tuple[str, ...] = ()):
    command = [*launcher, *_command(run_dir)[1:]] if launcher else _command(run_dir)
    return subprocess.run(
        [*command, *SMALL, *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=ROOT,
    )


def _latest(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    text = pointer.read_text().strip() if pointer.is_file() else ""
    return int(text.split("_")[1]) if text else 0


def _checkpoint(run_dir: Path, update: int | None = None) -> Path:
    return run_dir / "checkpoints" / f"update_{update or _latest(run_dir):06d}"


def _state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def _run_script_in_process(cfg) -> int:
    """`scripts/train_baseline.py`'s `run` in this process (its signal handlers put back)."""
    spec = importlib.util.spec_from_file_location("train_baseline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        return module.run(cfg)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run of the small DRRN set-up stopped by SIGTERM after its third checkpoint."""
    run_dir = tmp_path_factory.mktemp("drrn") / "stopped"
    process = subprocess.Popen(
        [*_command(run_dir), *SMALL, "train.total_frames=1000000", "train.save_every=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 240
        while _latest(run_dir) < 3:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "no third checkpoint in time"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    return run_dir, output


def test_a_stopped_run_leaves_ppos_run_folder_with_drrns_state(stopped_run) -> None:
    run_dir, output = stopped_run
    checkpoint = _checkpoint(run_dir)
    state = _state(checkpoint)
    assert f"preempted by SIGTERM: checkpoint saved at update {state['update']}" in output
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["policy"]["kind"] == "drrn"
    launch = config["launch"]
    assert launch["world_size"] == 1 and launch["envs_per_process"] == 4
    assert launch["frames_per_update"] == FRAMES_PER_ROW
    rows = read_metrics(run_dir)
    for name in (
        "charts/success_rate",
        "charts/episode_return",
        "charts/episode_length",
        "charts/episodes",
        "charts/fps",
        "charts/q_mean",
        "charts/temperature",
        "losses/td",
    ):
        assert name in rows[0], name
    # Every row logged is saved, the last one (cut short by the signal) included.
    assert [row["update"] for row in rows] == list(range(1, state["update"] + 1))
    assert rows[-1]["frames"] == state["frames"] and state["world_size"] == 1
    assert [row["frames"] for row in rows[:-1]] == [64.0 * k for k in range(1, len(rows))]
    assert math.isnan(rows[0]["losses/td"]) is False  # TD steps start at 32 frames
    assert rows[-1]["charts/gradient_steps"] == int((state["frames"] - 32) * 0.25)
    assert sum(row["charts/episodes"] for row in rows) == state["episodes"]

    check_checkpoint(checkpoint)  # PPO's checks pass: every file there, with its size
    manifest = json.loads((checkpoint / "manifest.json").read_text())["files"]
    for name in (
        "policy/glam_policy.json",
        "policy/model.safetensors",
        "optimizer.pt",
        "scheduler.json",
        "target.safetensors",
        "drrn_state.json",
        "rank_0/envs.json",
        "rank_0/rng.pt",
        "rank_0/replay.json",
        "rank_0/replay.safetensors",
    ):
        assert name in manifest, name
    replay = json.loads((checkpoint / "rank_0" / "replay.json").read_text())
    assert replay["size"] == state["frames"]  # one process: every frame is in its buffer
    policy = DRRNPolicy.from_pretrained(checkpoint / "policy")
    assert policy.training_env["name"] == "BabyAI-GoToRedBallNoDists-v0"
    assert policy.network == {"embedding_dim": 16, "hidden_dim": 32, "vocabulary_buckets": 4096}
    # Trained: the online weights left the target network's (the initial ones here).
    target = load_file(checkpoint / "target.safetensors")
    moved = max((target[k] - v).abs().max().item() for k, v in policy.state_dict().items())
    assert moved > 1e-3


def test_resume_continues_frames_rows_seeds_and_learning_state(
    stopped_run, tmp_path, capsys
) -> None:
    source, _ = stopped_run
    run_dir = shutil.copytree(source, tmp_path / "resumed")
    before = _checkpoint(run_dir)
    state = _state(before)
    envs_before = json.loads((before / "rank_0" / "envs.json").read_text())
    frames = state["frames"] + 2 * FRAMES_PER_ROW
    overrides = [*SMALL, f"train.output_dir={run_dir}", "train.resume=true"]
    cfg = compose_run("drrn", [*overrides, f"train.total_frames={frames}"])
    assert _run_script_in_process(cfg) == 0
    output = capsys.readouterr().out
    assert f"resumed from {before}" in output
    assert f"done: {frames} frames in {state['update'] + 2} updates" in output
    rows = read_metrics(run_dir)
    assert [row["update"] for row in rows] == list(range(1, state["update"] + 3))
    assert [row["frames"] for row in rows[-2:]] == [frames - 64.0, frames]
    # The replay buffer and the gradient step count came back and grew.
    assert rows[-2]["charts/replay_size"] == state["frames"] + 64
    assert rows[-1]["charts/gradient_steps"] == int((frames - 32) * 0.25)
    envs_after = json.loads((_checkpoint(run_dir) / "rank_0" / "envs.json").read_text())
    assert envs_after["seed"] == envs_before["seed"]
    # The next episodes of the same schedule: never one already played.
    assert all(
        after > before
        for after, before in zip(
            envs_after["episodes_started"], envs_before["episodes_started"], strict=True
        )
    )


def test_resume_restores_target_network_optimizer_and_replay(stopped_run, tmp_path) -> None:
    from accelerate import Accelerator

    source, _ = stopped_run
    run_dir = shutil.copytree(source, tmp_path / "restored")
    checkpoint = _checkpoint(run_dir)
    saved_steps = json.loads((checkpoint / "drrn_state.json").read_text())["gradient_steps"]
    cfg = compose_run("drrn", [*SMALL, f"train.output_dir={run_dir}", "train.resume=true"])
    t = build_drrn_training(cfg, Accelerator(cpu=True), run_dir)
    try:
        assert t.gradient_steps == saved_steps > 0
        target = load_file(checkpoint / "target.safetensors")
        for name, tensor in t.target.state_dict().items():
            assert torch.equal(tensor, target[name]), name
        online = load_file(checkpoint / "policy" / "model.safetensors")
        assert all(torch.equal(t.policy.state_dict()[k], v) for k, v in online.items())
        assert any(not torch.equal(online[k], v) for k, v in target.items())
        adam = next(iter(t.optimizer.state_dict()["state"].values()))
        assert int(adam["step"]) == saved_steps and adam["exp_avg_sq"].abs().sum() > 0
        replay = json.loads((checkpoint / "rank_0" / "replay.json").read_text())
        assert len(t.replay) == replay["size"] == _state(checkpoint)["frames"]
        newest = t.replay.select(t.replay.chronological_slots()[-1:])
        assert newest.prompts[0] in replay["texts"]
    finally:
        t.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "already holds a run (config.yaml, metrics.csv, checkpoints): pass train.resume=true"),
        (["train.resume=true", "drrn.hidden_dim=48"], "drrn.hidden_dim: 32 -> 48"),
        (["policy.prompt_format=chat"], "DRRN reads GLAM's text prompts"),
        (["train.save_rollouts=true"], "DRRN runs do not write them"),
        (["policy.kind=llm"], "policy.kind=llm trains a language model: use scripts/train_lang"),
    ],
)
def test_a_run_that_cannot_start_exits_2_saying_why(
    stopped_run, tmp_path, capsys, overrides: list[str], message: str
) -> None:
    source, _ = stopped_run
    run_dir = shutil.copytree(source, tmp_path / "used")
    cfg = compose_run("drrn", [*SMALL, f"train.output_dir={run_dir}", *overrides])
    assert _run_script_in_process(cfg) == 2
    assert message in capsys.readouterr().err


def test_bad_presets_and_keys_exit_1_and_llm_runs_are_sent_elsewhere(tmp_path: Path) -> None:
    missing = subprocess.run(
        _command(tmp_path / "a", config="no_such_preset"),
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    assert missing.returncode == 1 and "no_such_preset" in missing.stderr
    misspelt = _train(tmp_path / "b", "drrn.lrr=1")
    assert misspelt.returncode == 1 and "unknown key drrn.lrr" in misspelt.stderr
    llm = _train(tmp_path / "c", "policy.kind=llm")
    assert llm.returncode == 2 and "use scripts/train_language_agent.py" in llm.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_two_processes_each_keep_their_envs_and_replay_and_share_one_network(tmp_path) -> None:
    run_dir = tmp_path / "two"
    launcher = accelerate_launch("multi_cpu", 2)
    result = _train(run_dir, "train.total_frames=128", "train.save_every=1", launcher=launcher)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "2 process(es) (MULTI_CPU, cpu)" in result.stdout
    assert "done: 128 frames in 2 updates" in result.stdout
    launch = yaml.safe_load((run_dir / "config.yaml").read_text())["launch"]
    assert launch["world_size"] == 2 and launch["envs_per_process"] == 2
    checkpoint = _checkpoint(run_dir)
    assert _state(checkpoint)["world_size"] == 2
    check_checkpoint(checkpoint)
    replays = [json.loads((checkpoint / f"rank_{r}" / "replay.json").read_text()) for r in (0, 1)]
    assert [replay["size"] for replay in replays] == [64, 64]  # each its own half of the frames
    seeds = [json.loads((checkpoint / f"rank_{r}" / "envs.json").read_text()) for r in (0, 1)]
    assert seeds[0]["seed"] != seeds[1]["seed"]
    rows = read_metrics(run_dir)
    assert rows[-1]["charts/replay_size"] == 128  # summed over the processes
    # Gradient steps are counted on the global frames: as many as one process would take.
    assert rows[-1]["charts/gradient_steps"] == int((128 - 32) * 0.25)
    DRRNPolicy.from_pretrained(checkpoint / "policy")


# --------------------------------------------------------------------------------------------
# Learning
# --------------------------------------------------------------------------------------------

EVAL_EPISODES = 32
EVAL_SEED = 10**9  # far from the training seeds (run seed 1: 10**8 and up)


class UniformPolicy(torch.nn.Module):
    """Every candidate equally likely: the paper's random baseline."""

    def forward(self, prompts: list[str], candidates: list[list[str]]) -> PolicyOutput:
        logits = torch.zeros(len(prompts), max(len(c) for c in candidates))
        return PolicyOutput(logits, logits[:, 0], torch.ones_like(logits, dtype=torch.bool))


def _success(policy: torch.nn.Module, *, greedy: bool) -> float:
    env = EnvConfig(name="BabyAI-GoToRedBallNoDists-v0", num_envs=EVAL_EPISODES, action_space="nav")
    runner = EnvRunner(env, PolicyConfig(), num_envs=EVAL_EPISODES, seed=EVAL_SEED)
    episodes = play_episodes(policy, runner, greedy=greedy)
    runner.close()
    return sum(bool(episode["success"]) for episode in episodes) / len(episodes)


@pytest.mark.slow
def test_drrn_learns_to_go_to_the_red_ball_far_better_than_random(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from glam.runs.folder import policy_dir

    run_dir = tmp_path / "learn"
    cfg = compose_run(
        "drrn", [f"train.output_dir={run_dir}", "train.total_frames=6144", "train.seed=1"]
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_drrn(cfg, Accelerator(cpu=True), run_dir)
        trained = DRRNPolicy.from_pretrained(policy_dir(run_dir)).eval()
        drrn = _success(trained, greedy=True)
        with torch.random.fork_rng():
            randoms = []
            for seed in range(4):  # the same 32 episodes, 4 draws of the random actions
                torch.manual_seed(seed)
                randoms.append(_success(UniformPolicy(), greedy=False))
    finally:
        torch.set_num_threads(threads)
    random = sum(randoms) / len(randoms)
    print(f"greedy DRRN {drrn:.2f}, random {random:.2f} ({randoms})")
    assert random < 0.5
    assert drrn >= 0.8 and drrn >= random + 0.35


def test_a_drrn_run_is_evaluated_by_the_harness_as_a_text_agent(tmp_path) -> None:
    """A DRRN run folder through `post_training_tests`'s `evaluate`: greedy on Q, with the
    prompt-rewrite suites applied (DRRN reads the prompt, unlike the symbolic agent)."""
    from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
    from glam.eval.harness import evaluate

    run_dir = tmp_path / "drrn_run"
    trained = _train(run_dir, "train.total_frames=64")
    assert trained.returncode == 0, trained.stderr[-2000:]
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="checkpoint", path=str(run_dir)),
        eval=EvalConfig(
            level="BabyAI-GoToRedBallNoDists-v0",
            suites=["no_change", "adj_synonyms"],
            episodes=4,
            num_envs=2,
            max_steps=5,
            greedy=True,
            output_dir=str(tmp_path / "eval"),
            progress_bar=False,
        ),
    )
    results, _ = evaluate(cfg)
    records = results["suites"]
    assert {name: record["status"] for name, record in records.items()} == {
        "no_change": "ran",
        "adj_synonyms": "ran",
    }
    assert records["no_change"]["episodes"] == 4 and results["action_space"] == "nav"
