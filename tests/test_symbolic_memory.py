"""BabyAI's LSTM memory in the symbolic actor-critic (`symbolic.memory`) and recurrent PPO: the
network, the buffer's sequences, the rollout's memories, the update's replay of them, the saved
folder, a run with a teacher, and the evaluation harness.

Without memory nothing changes: tests/test_symbolic.py, test_symbolic_ppo.py, test_teach.py and
test_ppo_trainer.py pin the memoryless network, its folder and the trainer's numbers.
"""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from helpers_couplings import SMALL_SYMBOLIC
from helpers_tiny import one_torch_thread  # noqa: F401  (autouse fixture)
from omegaconf import OmegaConf

import babyai_text
from babyai_text import TextVectorEnv
from glam.baselines.config import SymbolicConfig
from glam.baselines.loading import load_policy
from glam.baselines.symbolic import SymbolicActorCritic, build_symbolic_policy
from glam.config import ConfigError, EnvConfig, PPOConfig, check_recurrence
from glam.envs import EnvRunner, resolve_action_space
from glam.eval.agents import SymbolicAgent
from glam.eval.builders import build_agent
from glam.eval.config import AgentConfig
from glam.eval.episodes import run_suite
from glam.eval.suites import SUITES
from glam.policy.observations import GridObservations, TextObservations
from glam.ppo.buffer import RolloutBuffer, sequence_positions
from glam.ppo.gae import compute_gae
from glam.ppo.hooks import TrainerHook
from glam.ppo.learner import StopSignal
from glam.ppo.rollout import play_episodes
from glam.ppo.trainer import collect_rollout, train
from glam.ppo.update import policy_output, ppo_update
from glam.run_config import compose_run
from glam.runs.checkpoint import read_trainer_state
from glam.runs.errors import SetupError
from glam.runs.folder import latest_checkpoint, policy_dir
from glam.teach.hook import TeachHook

LEVEL = "BabyAI-GoToLocal-v0"
NAV = ["turn left", "turn right", "go forward"]
MEMORY = SymbolicConfig(
    image_dim=8, instr_dim=8, film_layers=1, hidden_dim=8, vocabulary_buckets=64, memory=True
)
TRAINED_ENV = EnvConfig(name=LEVEL, nbr_obs=1, action_space="nav")
RECURRENCE = 4
SMALL_MEMORY = [
    *SMALL_SYMBOLIC,
    "symbolic.memory=true",
    f"ppo.recurrence={RECURRENCE}",
    f"env.name={LEVEL}",
]
"""A run of a few seconds with memory: 4 envs x 16 frames, sequences of 4 steps."""


def _policy(cfg: SymbolicConfig = MEMORY, seed: int = 0) -> SymbolicActorCritic:
    torch.manual_seed(seed)
    return SymbolicActorCritic(cfg, NAV).eval()


def _observations(seeds: list[int]) -> GridObservations:
    env = babyai_text.make(LEVEL)
    return GridObservations.from_minigrid([env.reset(seed=seed)[0] for seed in seeds])


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


# ---------------------------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------------------------


def test_without_memory_there_is_no_lstm_and_no_memory_to_pass() -> None:
    policy = _policy(SymbolicConfig(**{**MEMORY.__dict__, "memory": False}))
    assert policy.memory_size == 0 and not hasattr(policy, "memory_rnn")
    assert not any("memory" in name for name in policy.state_dict())
    obs = _observations([1, 2])
    assert policy(**obs.inputs()).memory is None
    with pytest.raises(ValueError, match=r"has no memory \(symbolic.memory=false\)"):
        policy(**obs.inputs(), memory=torch.zeros(2, 16))


def test_the_memory_carries_the_past_and_starts_at_zero() -> None:
    policy = _policy()
    assert policy.memory_size == 2 * MEMORY.image_dim
    first, second = _observations([1, 2, 3]), _observations([4, 5, 6])
    with torch.no_grad():
        start = policy(**first.inputs())
        zero = policy(**first.inputs(), memory=torch.zeros(3, policy.memory_size))
        after = policy(**second.inputs(), memory=start.memory)
        fresh = policy(**second.inputs())
        # Per example: an env's output depends on its own view and memory, not its batch.
        alone = policy(**second.select([1]).inputs(), memory=start.memory[1:2])
    assert start.memory.shape == (3, policy.memory_size) and start.memory.abs().sum() > 0
    assert torch.equal(start.logits, zero.logits) and torch.equal(start.memory, zero.memory)
    # The same view after another past: another action distribution and value.
    assert (after.logits - fresh.logits).abs().max() > 1e-4
    assert (after.values - fresh.values).abs().max() > 1e-5
    torch.testing.assert_close(alone.logits[0], after.logits[1], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"memory must be \(batch, memory_size\) = \(3, 16\)"):
        policy(**first.inputs(), memory=torch.zeros(3, 8))


def test_gradients_reach_the_lstm_through_a_carried_memory() -> None:
    policy = _policy().train()
    first = policy(**_observations([1, 2]).inputs())
    first.memory.retain_grad()
    second = policy(**_observations([3, 4]).inputs(), memory=first.memory)
    (second.values.sum() + second.logits[:, 2].sum()).backward()
    assert first.memory.grad.abs().sum() > 0  # the second step's loss reaches the first step
    silent = [n for n, p in policy.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not silent, silent


# ---------------------------------------------------------------------------------------------
# The buffer's layout and the update's sequences
# ---------------------------------------------------------------------------------------------


def test_sequence_positions_by_hand() -> None:
    # Sequences 2 and 0 of 3 steps: positions 6, 7, 8 and 0, 1, 2, step by step.
    assert sequence_positions(torch.tensor([2, 0]), 3).tolist() == [6, 0, 7, 1, 8, 2]
    assert sequence_positions(torch.tensor([5, 1, 3]), 1).tolist() == [5, 1, 3]


def _filled_buffer(with_memory: bool) -> RolloutBuffer:
    """2 steps of 3 envs; action `10 * step + env`, env 1 ending its episode at step 0."""
    buffer = RolloutBuffer(num_steps=2, num_envs=3)
    for step in range(2):
        actions = torch.tensor([10 * step + env for env in range(3)])
        buffer.add(
            TextObservations([f"s{step}e{env}" for env in range(3)], [["a"]] * 3),
            actions,
            torch.zeros(3),
            torch.zeros(3),
            torch.zeros(3),
            torch.tensor([False, step == 0, False]),
            memories=actions[:, None].float().repeat(1, 2) if with_memory else None,
        )
    return buffer


def test_a_buffer_with_memory_hands_its_rollout_over_env_by_env() -> None:
    advantages = torch.tensor([[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]])
    batch = _filled_buffer(True).transitions(advantages, advantages)
    assert batch.actions.tolist() == [0, 10, 1, 11, 2, 12]
    assert batch.observations.prompts == ["s0e0", "s1e0", "s0e1", "s1e1", "s0e2", "s1e2"]
    assert batch.advantages.tolist() == [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]
    assert batch.memories[:, 0].tolist() == [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]
    assert batch.dones.tolist() == [False, False, True, False, False, False]
    plain = _filled_buffer(False).transitions(advantages, advantages)
    assert plain.actions.tolist() == [0, 1, 2, 10, 11, 12] and plain.memories is None
    buffer = _filled_buffer(False)
    buffer.reset()
    buffer.add(TextObservations(["x"] * 3, [["a"]] * 3), *[torch.zeros(3)] * 5)
    with pytest.raises(ValueError, match="step 1 brings a memory, the rollout's first step did"):
        buffer.add(
            TextObservations(["x"] * 3, [["a"]] * 3),
            *[torch.zeros(3)] * 5,
            memories=torch.zeros(3, 2),
        )


def test_recurrence_must_tile_the_rollout_and_every_minibatch() -> None:
    with pytest.raises(ConfigError, match=r"ppo.recurrence=20 must divide ppo.frames_per_env=128"):
        compose_run("symbolic_ppo", ["symbolic.memory=true"])
    with pytest.raises(ConfigError, match=r"each process, ppo.minibatch_size=256 \("):
        compose_run("symbolic_ppo", ["symbolic.memory=true", "ppo.frames_per_env=120"])
    with pytest.raises(ConfigError, match=r"ppo.recurrence=4 must divide ppo.micro_batch_size=6"):
        compose_run(
            "symbolic_ppo",
            ["symbolic.memory=true", "ppo.recurrence=4", "ppo.micro_batch_size=6"],
        )
    ppo = PPOConfig(frames_per_env=16, minibatch_size=32, micro_batch_size=None, recurrence=16)
    check_recurrence(ppo)
    with pytest.raises(ValueError, match=r"ppo.minibatch_size=32 / 4 processes = 8 \("):
        check_recurrence(ppo, processes=4)
    # Without memory the key is not read.
    assert compose_run("symbolic_ppo").ppo.recurrence == 20


def test_the_memory_presets_are_their_bases_with_memory() -> None:
    for preset, base in (
        ("symbolic_ppo_memory", "symbolic_ppo"),
        ("teach_symbolic_memory", "teach_symbolic"),
    ):
        with_memory = OmegaConf.to_container(OmegaConf.structured(compose_run(preset)))
        without = OmegaConf.to_container(OmegaConf.structured(compose_run(base)))
        changed = {
            (section, key)
            for section, values in with_memory.items()
            for key, value in values.items()
            if without[section][key] != value
        }
        assert changed == {("symbolic", "memory"), ("ppo", "recurrence")}, preset
        assert with_memory["symbolic"]["memory"] and with_memory["ppo"]["recurrence"] == 16


# ---------------------------------------------------------------------------------------------
# The rollout and the update
# ---------------------------------------------------------------------------------------------


def _rollout(
    policy: torch.nn.Module, runner: EnvRunner, cfg, memory: torch.Tensor | None = None
) -> tuple[RolloutBuffer, object]:
    buffer = RolloutBuffer(cfg.ppo.frames_per_env, runner.num_envs)
    stop = StopSignal()
    try:
        rollout = collect_rollout(
            policy, runner, buffer, cfg, Accelerator(cpu=True), stop, memory=memory
        )
    finally:
        stop.restore()
    return buffer, rollout


def _short_episode_runner(cfg, max_steps: int = 3) -> EnvRunner:
    """4 grid envs whose episodes end after at most `max_steps` steps."""
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=4, seed=3, observation_kind="grid")
    runner.envs.close()
    space = resolve_action_space(cfg.env.action_space)
    runner.envs = TextVectorEnv(cfg.env.name, 4, seed=3, action_space=space, max_steps=max_steps)
    runner.reset()
    return runner


def test_the_rollout_zeroes_the_memory_where_an_episode_ends_and_goes_on_with_it() -> None:
    cfg = compose_run("symbolic_ppo", SMALL_MEMORY)
    torch.manual_seed(0)
    policy = build_symbolic_policy(cfg, None)
    runner = _short_episode_runner(cfg)
    buffer, rollout = _rollout(policy, runner, cfg)
    dones = buffer.dones
    assert dones.any() and (~dones).any()
    assert not buffer.memories[0].any()  # a fresh start: every env at an episode's start
    read_next = torch.cat([buffer.memories[1:], rollout.memory[None]])  # (steps, envs, memory)
    with torch.no_grad():
        for step in range(buffer.num_steps):
            inputs = buffer.observations[step].inputs()
            after = policy(**inputs, memory=buffer.memories[step]).memory
            expected = torch.where(dones[step][:, None], 0.0, after)
            torch.testing.assert_close(read_next[step], expected, rtol=0, atol=1e-6)
        assert read_next[~dones].abs().sum(-1).min() > 0  # what goes on is not zero
        # The bootstrap value reads the envs' current view with their current memory.
        now = policy(**runner.observations().inputs(), memory=rollout.memory)
    torch.testing.assert_close(rollout.last_values, now.values, rtol=0, atol=1e-6)
    # The next rollout starts from where this one stopped.
    next_buffer, _ = _rollout(policy, runner, cfg, rollout.memory)
    assert torch.equal(next_buffer.memories[0], rollout.memory)
    runner.close()


def test_a_time_out_is_valued_with_the_memory_of_the_episode_it_ends() -> None:
    cfg = compose_run("symbolic_ppo", [*SMALL_MEMORY, "ppo.bootstrap_truncated=true"])
    torch.manual_seed(0)
    policy = build_symbolic_policy(cfg, None)
    runner = _short_episode_runner(cfg)
    asked = []  # per step, the envs a time-out cut and their final observations
    final_observations = runner.final_observations

    def recording_final_observations():  # noqa: ANN202
        asked.append(final_observations())
        return asked[-1]

    runner.final_observations = recording_final_observations
    buffer, _ = _rollout(policy, runner, cfg)
    runner.close()
    finals = [(step, envs, obs) for step, (envs, obs) in enumerate(asked) if envs]
    assert finals and buffer.final_values.ne(0).sum() == sum(len(envs) for _, envs, _ in finals)
    with torch.no_grad():
        for step, envs, observations in finals:
            inputs = buffer.observations[step].inputs()
            after = policy(**inputs, memory=buffer.memories[step]).memory[envs]
            values = policy(**observations.inputs(), memory=after).values
            fresh = policy(**observations.inputs()).values
            torch.testing.assert_close(buffer.final_values[step, envs], values, rtol=0, atol=1e-6)
            assert (values - fresh).abs().max() > 1e-6  # not the value of a memoryless view


def test_the_update_replays_the_rollouts_memories_exactly() -> None:
    """The first epoch's forward over sequences (stored memory at each start, carried and zeroed
    at episode ends) gives the rollout's log-probs and values: PPO's first ratio is 1."""
    cfg = compose_run("symbolic_ppo", SMALL_MEMORY)
    torch.manual_seed(0)
    policy = build_symbolic_policy(cfg, None)
    runner = _short_episode_runner(cfg)  # episodes end inside the sequences
    buffer, rollout = _rollout(policy, runner, cfg)
    runner.close()
    advantages, returns = compute_gae(
        buffer.rewards,
        buffer.values,
        buffer.dones,
        rollout.last_values,
        gamma=0.99,
        gae_lambda=0.95,
    )
    batch = buffer.transitions(advantages, returns)
    order = torch.randperm(len(batch) // RECURRENCE)
    mb = batch.select(sequence_positions(order, RECURRENCE))
    assert mb.dones.reshape(RECURRENCE, -1)[:-1].any()  # a sequence crosses an episode's end
    policy.train()
    with torch.no_grad():
        output = policy_output(policy, mb, RECURRENCE)
        logprobs = output.dist.log_prob(mb.actions)
        torch.testing.assert_close(logprobs, mb.logprobs, rtol=0, atol=1e-5)
        torch.testing.assert_close(output.values, mb.values, rtol=0, atol=1e-5)
        # The negative controls: the memory matters, and so does zeroing it at an episode's end.
        mb.memories.zero_()
        forgetful = policy_output(policy, mb, RECURRENCE).dist.log_prob(mb.actions)
        mb = batch.select(sequence_positions(order, RECURRENCE))
        mb.dones.zero_()
        unmasked = policy_output(policy, mb, RECURRENCE).dist.log_prob(mb.actions)
    assert (forgetful - mb.logprobs).abs().max() > 1e-4
    assert (unmasked - mb.logprobs).abs().max() > 1e-4

    # The recomputed log-probs (reduced precision) go through the same sequences: ratio 1 exactly.
    twin = copy.deepcopy(policy)
    recomputed = ppo_update(
        twin,
        torch.optim.Adam(twin.parameters(), lr=1e-2),
        buffer.transitions(advantages, returns),
        cfg.ppo,
        Accelerator(cpu=True),
        True,
    )
    assert recomputed["debug/first_ratio_deviation"] == 0.0

    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = ppo_update(policy, optimizer, batch, cfg.ppo, Accelerator(cpu=True), False)
    assert metrics["debug/first_ratio_deviation"] < 1e-5
    assert all(np.isfinite(value) for value in metrics.values())
    moved = dict(zip([n for n, _ in policy.named_parameters()], before, strict=True))
    assert (policy.memory_rnn.weight_hh - moved["memory_rnn.weight_hh"]).abs().max() > 0


class RowCheck(TrainerHook):
    """Records, at each update's first micro-batch (before any step), how far the policy's
    log-probs of the batch's actions are from the rollout's: 0 if the rows the hooks see match
    the output's row for row."""

    def __init__(self) -> None:
        self.deviations: list[float] = []
        self._first = True

    def loss(self, output, batch):  # noqa: ANN001, ANN201
        if self._first:
            logprobs = output.dist.log_prob(batch.actions).detach()
            self.deviations.append(float((logprobs - batch.logprobs).abs().max()))
            self._first = False
        return None

    def after_update(self, training, model, metrics):  # noqa: ANN001, ANN201
        self._first = True
        return {}


def test_a_student_with_memory_is_taught_checkpointed_and_resumed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [*SMALL_MEMORY, "teach.teacher=bot", "teach.off_after=2", "train.save_every=1"]
    cfg = compose_run("symbolic_ppo", [*overrides, f"train.output_dir={run_dir}"])
    rows = RowCheck()
    result = train(
        cfg,
        Accelerator(cpu=True),
        run_dir,
        make_policy=build_symbolic_policy,
        hooks=[TeachHook(cfg.teach), rows],
    )
    assert result.state.update == 3 and result.state.frames == 192
    metrics = _metrics(run_dir)
    assert [float(row["debug/first_ratio_deviation"]) < 1e-5 for row in metrics] == [True] * 3
    assert rows.deviations and max(rows.deviations) < 1e-5
    # Taught for two updates: the distillation term saw the advised rows.
    assert [float(row["teach/coef"]) > 0 for row in metrics] == [True, True, False]
    assert all(float(row["teach/advice_fraction"]) > 0.0 for row in metrics[:2])
    assert all(np.isfinite(float(row["teach/ce"])) for row in metrics[:2])

    saved = load_policy(policy_dir(run_dir))
    assert isinstance(saved, SymbolicActorCritic) and saved.cfg.memory
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=3, seed=10**9, observation_kind="grid")
    assert len(play_episodes(saved.eval(), runner, greedy=True)) == 3
    runner.close()
    more = compose_run(
        "symbolic_ppo",
        [*overrides, "train.total_frames=256", "train.resume=true", f"train.output_dir={run_dir}"],
    )
    again = train(more, Accelerator(cpu=True), run_dir, make_policy=build_symbolic_policy)
    assert again.state.update == 4 and read_trainer_state(latest_checkpoint(run_dir)).update == 4
    assert float(_metrics(run_dir)[-1]["debug/first_ratio_deviation"]) < 1e-5


def test_a_run_resumes_only_with_the_memory_setting_of_its_network(tmp_path: Path) -> None:
    # A checkpoint written before `symbolic.memory` existed records no such key in its
    # config.yaml (the same-run check cannot see it): its policy folder says what it is.
    checkpoint = tmp_path / "update_000001"
    _policy(SymbolicConfig(**{**MEMORY.__dict__, "memory": False})).save_pretrained(
        checkpoint / "policy", training_env=TRAINED_ENV
    )
    cfg = compose_run("symbolic_ppo", SMALL_MEMORY)
    with pytest.raises(
        SetupError,
        match=r"cannot resume: .*policy holds a network without memory, the run has "
        r"symbolic.memory=true",
    ):
        build_symbolic_policy(cfg, checkpoint)
    cfg.symbolic.memory = False
    assert build_symbolic_policy(cfg, checkpoint).memory_size == 0


# ---------------------------------------------------------------------------------------------
# The folder, and the evaluation harness
# ---------------------------------------------------------------------------------------------


def test_a_policy_with_memory_saves_and_loads_as_one(tmp_path: Path) -> None:
    policy = _policy()
    policy.save_pretrained(tmp_path / "memory", training_env=TRAINED_ENV)
    meta = json.loads((tmp_path / "memory" / "glam_policy.json").read_text())
    assert meta["symbolic"]["memory"] is True
    loaded = SymbolicActorCritic.from_pretrained(tmp_path / "memory").eval()
    obs, memory = _observations([1, 2]), torch.randn(2, policy.memory_size)
    with torch.no_grad():
        expected, got = policy(**obs.inputs(), memory=memory), loaded(**obs.inputs(), memory=memory)
    assert torch.equal(got.logits, expected.logits) and torch.equal(got.memory, expected.memory)
    agent = build_agent(AgentConfig(kind="checkpoint", path=str(tmp_path / "memory")), greedy=True)
    assert isinstance(agent, SymbolicAgent) and agent.policy.memory_size == policy.memory_size

    # A folder written before the key existed: no `memory`, a memoryless policy as it was.
    memoryless = _policy(SymbolicConfig(**{**MEMORY.__dict__, "memory": False}))
    memoryless.save_pretrained(tmp_path / "old")
    file = tmp_path / "old" / "glam_policy.json"
    meta = json.loads(file.read_text())
    del meta["symbolic"]["memory"]
    file.write_text(json.dumps(meta))
    old = SymbolicActorCritic.from_pretrained(tmp_path / "old").eval()
    assert old.memory_size == 0 and not old.cfg.memory
    with torch.no_grad():
        assert torch.equal(old(**obs.inputs()).logits, memoryless(**obs.inputs()).logits)


class RecordingPolicy(SymbolicActorCritic):
    """Records the memory each forward reads and returns."""

    def __init__(self, cfg: SymbolicConfig, words: list[str]) -> None:
        super().__init__(cfg, words)
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, images, directions, missions, memory=None):  # noqa: ANN001, ANN201
        output = super().forward(images, directions, missions, memory)
        self.calls.append((memory.clone(), output.memory.clone()))
        return output


def test_the_harness_plays_a_memory_policy_with_a_fresh_memory_each_episode() -> None:
    torch.manual_seed(0)
    policy = RecordingPolicy(MEMORY, NAV).eval()
    agent = SymbolicAgent("memory", policy, greedy=False, batch_size=1)  # one forward per env
    requests = []
    act = agent.act
    agent.act = lambda request: requests.append(request) or act(request)
    run = run_suite(
        agent,
        SUITES["no_change"],
        level=LEVEL,
        episodes=5,
        num_envs=2,  # slots are reused: an episode starts where another ended
        seed_base=10**12,
        nbr_obs=1,
        action_space="nav",
        max_steps=3,
    )
    assert len(run.episodes) == 5
    calls = iter(policy.calls)
    last: dict[int, torch.Tensor] = {}
    restarted = 0
    for request in requests:
        for slot, new in zip(request.slots, request.new_episode, strict=True):
            read, returned = next(calls)
            if new:
                assert not read.any()
                restarted += slot in last and bool(last[slot].any())
            else:
                assert torch.equal(read[0], last[slot])
            last[slot] = returned[0]
    assert next(calls, None) is None
    assert restarted >= 3  # the later episodes started from zero, not from the slot's last memory
