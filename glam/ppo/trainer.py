"""Online PPO fine-tuning of a language-model actor-critic in BabyAI-Text.

`train` reads top to bottom like CleanRL's `ppo.py`: build everything, then per update collect a
rollout, compute advantages, run the PPO epochs, log, checkpoint. The advantages and the loss are
the algorithm's (`glam.ppo.algorithms`, `algorithm.name`): PPO's GAE and clipped loss by default,
GRPO's or GiGPO's group estimates otherwise; a policy that writes its action
(`glam.policy.writer`) goes through the same loop, its answers stored with its observations. Distribution goes through the
`Accelerator` only: each process steps `env.num_envs / world_size` environments, gradients are
averaged by DDP (or DeepSpeed), metrics are reduced over processes.

A policy with memory (`memory_size` > 0: BabyAI's LSTM, `symbolic.memory`) is trained as
BabyAI's PPO trains it. The rollout keeps one memory per local env, stores the memory each step
read, and zeroes an env's memory when its episode ends; the memories go on from one rollout to
the next (a new session starts from zero: its envs start new episodes). The update cuts each
env's rollout into sequences of `ppo.recurrence` consecutive steps; minibatches are whole
sequences; each sequence starts from the memory stored at its first step and carries the
policy's new memory through its steps, zeroed after an episode's end, so gradients flow back
through the sequence; PPO's loss is the mean over all the steps of the minibatch (BabyAI
averages the per-step means, the same number with equal sizes). Sequences start at the same
steps in every epoch (BabyAI's `PPOAlgo`; torch-ac's newer one shifts them every other epoch).
Hooks see a recurrent minibatch as any other: the rows of the sequences' steps and the policy's
output on each (`TrainerHook.loss`).
"""

from __future__ import annotations

import math
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from omegaconf import OmegaConf

import babyai_text
from glam.config import LANGUAGE_MODEL_KINDS, PPOConfig, check_recurrence
from glam.demos import write_demos
from glam.envs import MAX_PROCESSES, EnvRunner, env_seed, resolve_action_space
from glam.models.loading import ModelNotFoundError, prepare_model_cache
from glam.models.precision import resolve_autocast_bf16
from glam.policy.llm_policy import CheckpointError, LLMActorCritic
from glam.policy.observations import new_episodes_forget, policy_inputs
from glam.policy.output import PolicyOutput
from glam.policy.writer import WritingActorCritic
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.algorithms import PPO, Algorithm, build_algorithm
from glam.ppo.buffer import RolloutBuffer, Transitions, sequence_positions
from glam.ppo.diagnostics import gradient_split
from glam.ppo.hooks import TrainerHook
from glam.ppo.logger import MetricsLogger, ProgressBar
from glam.ppo.losses import explained_variance, normalize_advantages
from glam.ppo.rollout import EpisodeStats
from glam.ppo.timing import PhaseClock, peak_rss_mib
from glam.ppo.written import WrittenEnvRunner
from glam.run_config import TrainingRunConfig
from glam.runs.checkpoint import TrainerState, save_checkpoint
from glam.runs.errors import SetupError, TrainingDiverged
from glam.runs.lifecycle import (
    announce_resume,
    open_run_dir,
    resolved_config_yaml,
    restore_training_state,
)


@dataclass
class TrainResult:
    """How a call to `train` ended."""

    state: TrainerState
    """Counters at the end."""
    checkpoint: Path | None
    """The newest complete checkpoint."""
    stopped_by: str | None = None
    """Name of the signal that stopped the run early (SIGTERM, SIGUSR1, SIGINT), or None."""


@dataclass
class Rollout:
    """What a rollout hands to the update besides the buffer."""

    last_values: torch.Tensor
    """`(envs,)` value of the state after the last step, to bootstrap GAE."""
    episodes: EpisodeStats = field(default_factory=EpisodeStats)
    """Episodes that ended during the rollout (this process)."""
    seconds: float = 0.0
    """Wall time of the rollout."""
    frames: int = 0
    """Primitive steps the local envs took (`ppo.frames_per_env` per env, unless a coded
    action of `glam.codeact` took several)."""
    memory: torch.Tensor | None = None
    """`(envs, memory_size)` a policy with memory's memory for each env's next step (zero
    where an episode just ended), to go on with in the next rollout; None without memory."""


class StopSignal:
    """Remembers SIGTERM / SIGUSR1 (cluster preemption) and SIGINT (Ctrl-C) so the loop can save
    and exit cleanly; a second SIGINT, a second or more after the first, raises KeyboardInterrupt
    at once (`accelerate launch` forwards the terminal's Ctrl-C, which its processes also get:
    that copy comes within milliseconds and is not a second Ctrl-C).

    Installed until `restore`: a script keeps it until the process exits, so that a signal that
    comes during the last save or the exit is recorded, never fatal.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    REPEAT_SECONDS = 1.0
    """A SIGINT this long after the first is a second Ctrl-C."""

    def __init__(self) -> None:
        self.received: str | None = None
        """The first signal received, by name."""
        self.stopping = False
        """`requested` has said yes: every process is stopping."""
        self._interrupted_at: float | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._interrupted_at is None:
                self._interrupted_at = now
            elif now - self._interrupted_at >= self.REPEAT_SECONDS:
                raise KeyboardInterrupt
        self.received = self.received or signal.Signals(signum).name

    def requested(self, accelerator: Accelerator) -> bool:
        """True on every process as soon as any process received a stop signal (collective)."""
        if accelerator.num_processes == 1:  # nothing to share: no round trip through a GPU
            self.stopping = self.stopping or self.received is not None
            return self.stopping
        flag = torch.tensor([float(self.received is not None)], device=accelerator.device)
        if accelerator.num_processes > 1:
            flag = accelerator.reduce(flag, reduction="sum")
        self.stopping = self.stopping or bool(flag.item() > 0)
        return self.stopping

    @property
    def name(self) -> str:
        """What stopped the run: the signal this process received, or another's."""
        return self.received or "a stop signal on another process"

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


def train(
    cfg: TrainingRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    stop: StopSignal | None = None,
    make_policy: PolicyFactory | None = None,
    hooks: Sequence[TrainerHook] = (),
) -> TrainResult:
    """Run (or resume) PPO until `train.total_frames`, a stop signal, or divergence.

    The run stops after the first update that brings the frames (over every session of the run,
    whatever `ppo.frames_per_env` each used) to `train.total_frames` or past it; frames are
    primitive steps (a coded action counts the steps it took). `stop` records
    stop signals; without it, one is installed for the call only. `make_policy` builds the
    actor-critic (see `PolicyFactory`); by default the language-model policy of `cfg`. `hooks`
    join the loop at the points of `glam.ppo.hooks.TrainerHook`.

    Raises:
        SetupError: the run cannot start (message says why).
        TrainingDiverged: a non-finite loss; the last good checkpoint is left untouched.
        CheckpointWriteError: a checkpoint could not be written (a full disk...); the last
            complete one is left untouched.
    """
    own_stop = stop is None
    stop = StopSignal() if stop is None else stop
    t = None
    try:
        t = build_training(cfg, accelerator, run_dir, make_policy, hooks)
        checkpoint = t.resumed_from
        start_time = time.perf_counter() - t.state.elapsed_seconds
        t.runner.reset()
        for hook in hooks:
            hook.start(t)
        while t.state.frames < cfg.train.total_frames and not stop.requested(accelerator):
            # 1. Rollout: score every local env's candidates in one batch, sample, step, store.
            rollout = collect_rollout(
                t.model, t.runner, t.buffer, cfg, accelerator, stop, hooks, t.clock, t.memory
            )
            if rollout is None:  # stop signal mid-rollout: drop it, keep the last update
                break
            t.memory = rollout.memory  # the envs' episodes go on in the next rollout
            # What a writing policy's answers say; the guard stops a collapsed one here.
            answer_metrics = t.runner.rollout_metrics(accelerator)
            # 2. Advantages: the algorithm's (PPO's GAE, GRPO's or GiGPO's group estimates).
            batch, advantage_metrics = t.algorithm.advantages(
                t.buffer, rollout.last_values, accelerator
            )
            # 3. PPO epochs over minibatches.
            learning_rate = t.optimizer.param_groups[0]["lr"]
            update_start = time.perf_counter()
            stats = ppo_update(
                t.model,
                t.optimizer,
                batch,
                cfg.ppo,
                accelerator,
                t.recompute,
                hooks,
                t.clock,
                algorithm=t.algorithm,
            )
            t.scheduler.step()
            update_seconds = time.perf_counter() - update_start
            # 4. Counters and logs.
            counts = torch.cat(
                [rollout.episodes.as_tensor(), torch.tensor([rollout.frames], dtype=torch.float64)]
            )
            counts = accelerator.reduce(counts.to(accelerator.device))
            episodes, frames = counts[:4], int(counts[4].item())
            t.state.update += 1
            t.state.frames += frames
            t.state.episodes += int(episodes[0].item())
            t.state.elapsed_seconds = time.perf_counter() - start_time
            metrics = {
                **stats,
                **episode_metrics(episodes),
                "losses/explained_variance": _gathered_explained_variance(accelerator, batch),
                "charts/learning_rate": learning_rate,
                "charts/rollout_fps": frames / rollout.seconds,
                "charts/update_fps": frames / update_seconds,
                "charts/fps": frames / (rollout.seconds + update_seconds),
                **t.clock.take(),
                "memory/peak_rss_mib": peak_rss_mib(),
                **advantage_metrics,
                **answer_metrics,
            }
            if t.cache_trunk:
                metrics["memory/trunk_cache_mib"] = batch.observations.trunk_nbytes / 2**20
            del batch
            t.buffer.reset()  # the trunk's states go now, not when the next rollout replaces them
            for hook in hooks:
                metrics |= hook.after_update(t, t.model, metrics)
            summary = _summary_line(t.state, t.num_updates, metrics)
            log_update(t.logger, t.progress, t.state, metrics, summary)
            # 5. Checkpoint.
            if checkpoint_due(cfg, t.state):
                checkpoint = t.save()
        if not stop.stopping:  # a helper's failure is the run's, even in a short run
            for hook in hooks:
                hook.finish(t)
        if stop.stopping or checkpoint is None:
            checkpoint = t.save()  # a no-op if this update was just saved
    finally:
        for hook in hooks:
            hook.close()
        if t is not None:
            t.close()
        if own_stop:
            stop.restore()
    stopped_by = stop.name if stop.stopping else None
    return TrainResult(state=t.state, checkpoint=checkpoint, stopped_by=stopped_by)


@torch.no_grad()
def collect_rollout(
    model: torch.nn.Module,
    runner: EnvRunner,
    buffer: RolloutBuffer,
    cfg: TrainingRunConfig,
    accelerator: Accelerator,
    stop: StopSignal,
    hooks: Sequence[TrainerHook] = (),
    clock: PhaseClock | None = None,
    memory: torch.Tensor | None = None,
) -> Rollout | None:
    """Fill `buffer` with `ppo.frames_per_env` steps of every local env; None if asked to stop.

    `hooks` observe each step before the policy acts (their tensors are stored with the step)
    and after the envs applied the actions. `clock` is charged the forwards and the env steps.
    A policy with memory starts from `memory` `(envs, memory_size)` (the last rollout's
    `Rollout.memory`; None: zero, every env at an episode's start); it is ignored otherwise."""
    clock = clock or PhaseClock()
    start, start_frames = time.perf_counter(), runner.frames
    model.eval()
    buffer.reset()
    runner.begin_rollout()
    episodes = EpisodeStats()
    size = memory_size(model, accelerator)
    if not size:
        memory = None
    elif memory is None:
        memory = torch.zeros(runner.num_envs, size)
    # Final observations of time-outs ride along with the next forward pass, so every process
    # runs the same number of forwards (ZeRO-3 gathers weights in each).
    final_envs: list[int] = []
    finals, final_memory = None, None
    for t in range(buffer.num_steps + 1):
        observations = runner.observations()
        inputs = observations if finals is None else type(observations).cat([observations, finals])
        memories = memory if finals is None or memory is None else torch.cat([memory, final_memory])
        with clock.phase("rollout_forward"):
            batch = model(**policy_inputs(inputs, memories))
            raise_if_diverged(accelerator, ~_finite(batch))
        values = batch.values.float().cpu()
        for env, value in zip(final_envs, values[len(observations) :], strict=True):
            buffer.final_values[t - 1, env] = value
        if t == buffer.num_steps:
            last_values = values[: len(observations)]
            break
        output = batch.rows(len(observations))
        stored = stored_observations(observations, output)
        extras: dict[str, torch.Tensor] = {}
        for hook in hooks:
            extras |= hook.observe(observations)
        actions = output.dist.sample()
        with clock.phase("env_step"):
            rewards, dones, ended = runner.step(played_actions(output, actions))
            for hook in hooks:
                hook.after_step(actions, rewards, dones)
            buffer.add(
                stored,
                actions,
                output.dist.log_prob(actions),
                output.values,
                torch.as_tensor(rewards) * cfg.env.reward_scale,
                torch.as_tensor(dones),
                extras,
                memory,
            )
            final_envs, finals = (
                runner.final_observations() if cfg.ppo.bootstrap_truncated else ([], None)
            )
        if memory is not None:
            # A time-out's final view is valued with the memory of the episode it ends; the env's
            # next step starts a new episode, from a zero memory.
            next_memory = output.memory.float().cpu()
            final_memory = next_memory[final_envs]
            memory = new_episodes_forget(next_memory, dones)
        for episode in ended:
            if episode is not None:
                episodes.add(episode)
        if stop.requested(accelerator):
            return None
    seconds, frames = time.perf_counter() - start, runner.frames - start_frames
    return Rollout(last_values, episodes, seconds, frames, memory)


def stored_observations(observations: Any, output: PolicyOutput) -> Any:
    """A step's observations as the buffer keeps them, with what the rollout's forward computed
    that the update reads back: the frozen trunk's states (`glam.trunk`), and the answers a
    writing policy wrote (`glam.policy.writer`: the update scores those tokens)."""
    if output.trunk is not None:
        observations = observations.with_trunk(output.trunk)
    answers = getattr(output, "answers", None)
    return observations if answers is None else observations.with_answers(answers)


def played_actions(output: PolicyOutput, actions: torch.Tensor) -> Any:
    """What the runner plays: the sampled action indices, or a writing policy's answers (its
    runner reads the action each names, and keeps the answer in the env's history)."""
    answers = getattr(output, "answers", None)
    return actions.tolist() if answers is None else answers


def memory_size(model: torch.nn.Module, accelerator: Accelerator) -> int:
    """How many numbers of memory the policy carries per env (its `memory_size`; 0: none)."""
    return int(getattr(accelerator.unwrap_model(model), "memory_size", 0))


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Transitions,
    ppo: PPOConfig,
    accelerator: Accelerator,
    recompute: bool,
    hooks: Sequence[TrainerHook] = (),
    clock: PhaseClock | None = None,
    *,
    algorithm: Algorithm | None = None,
) -> dict[str, float]:
    """Run `ppo.epochs` epochs of minibatch gradient steps on `batch` (this process's part).

    Each micro-batch's loss is the algorithm's (`glam.ppo.algorithms`; by default PPO's) plus
    the terms `hooks` add (`TrainerHook.loss`). `clock` is charged the forwards, backwards and
    optimizer steps.

    Each process takes `minibatch_size / world_size` transitions per step, in chunks of
    `micro_batch_size` with gradient accumulation; gradients are averaged over processes. With
    memory (`batch.memories`, env-major) the minibatches and chunks are whole sequences of
    `ppo.recurrence` steps (the module docstring).

    Returns metrics averaged over minibatches and processes, plus `debug/first_ratio_deviation`:
    `max |ratio - 1|` on the first minibatch, before any step (0 unless log-probs drift between
    the rollout's forward and the update's).

    Raises:
        TrainingDiverged: on a non-finite loss or gradient norm (on every process at once).
    """
    clock = clock or PhaseClock()
    algorithm = algorithm or PPO(AlgorithmConfig(), ppo)
    device = accelerator.device
    local_minibatch = ppo.minibatch_size // accelerator.num_processes
    micro = micro_batch_size(ppo, accelerator.num_processes)
    # One optimizer step per minibatch, whoever built the accelerator (DeepSpeed's engine was
    # given the same number by `_configure_deepspeed`).
    accelerator.gradient_accumulation_steps = local_minibatch // micro
    model.train()
    if ppo.normalize_advantages and algorithm.normalizes_advantages:
        mean, std = _global_mean_std(accelerator, batch.advantages)
        batch.advantages = normalize_advantages(batch.advantages, mean, std)
    # Without memory a "sequence" is one transition, and this is plain PPO's shuffle.
    recurrence = 1 if batch.memories is None else ppo.recurrence
    if len(batch) % recurrence:
        raise ValueError(
            f"{len(batch)} transitions are not whole sequences of ppo.recurrence={recurrence} steps"
        )
    orders = [torch.randperm(len(batch) // recurrence) for _ in range(ppo.epochs)]
    sequences, micro_sequences = local_minibatch // recurrence, micro // recurrence
    if recompute:
        with clock.phase("recompute"):
            _recompute_old_logprobs(model, batch, orders[0], sequences, micro_sequences, recurrence)
    trainable = [p for p in model.parameters() if p.requires_grad]
    split = {}
    if algorithm.name == "ppo" and accelerator.distributed_type != DistributedType.DEEPSPEED:
        first = orders[0].split(sequences)[0].split(micro_sequences)[0]
        with clock.phase("diagnostics"):
            split = _gradient_split(
                accelerator,
                model,
                batch.select(sequence_positions(first, recurrence)),
                ppo,
                algorithm,
            )

    sums: dict[str, float] = defaultdict(float)
    # The algorithm's stats stay on the device, in float64 (the sums Python's floats gave), and
    # are read once after the epochs: a read per micro-batch would make the host wait for the
    # GPU before it could prepare the next micro-batch.
    stat_sums: dict[str, torch.Tensor] = {}
    count, steps, first_deviation, epochs_run = 0, 0, None, 0
    for epoch in range(ppo.epochs):
        epoch_kl: list[torch.Tensor] = []
        for minibatch in orders[epoch].split(sequences):
            for chunk in minibatch.split(micro_sequences):
                mb = batch.select(sequence_positions(chunk, recurrence))
                with accelerator.accumulate(model):
                    with clock.phase("forward"):
                        loss, stats = _chunk_loss(
                            model, mb, ppo, device, hooks, recurrence, algorithm
                        )
                        raise_if_diverged(accelerator, not torch.isfinite(loss).item())
                    with clock.phase("backward"):
                        accelerator.backward(loss)
                    with clock.phase("optimizer"):
                        if accelerator.sync_gradients:
                            grad_norm = accelerator.clip_grad_norm_(trainable, ppo.max_grad_norm)
                            if grad_norm is not None:  # DeepSpeed clips internally, may not say
                                norm = float(grad_norm)
                                raise_if_diverged(accelerator, not math.isfinite(norm))
                                sums["losses/grad_norm"] += norm
                                steps += 1
                        optimizer.step()  # a no-op until the last chunk of the minibatch
                        optimizer.zero_grad()
                if first_deviation is None:
                    first_deviation = stats["ratio_max_deviation"].detach()
                for key, value in stats.items():
                    if key != "ratio_max_deviation":
                        term = value.detach().double().reshape(()) * len(mb)
                        total = stat_sums.get(key)
                        stat_sums[key] = term if total is None else total + term
                count += len(mb)
                if ppo.target_kl is not None:
                    epoch_kl.append(stats["approx_kl"].detach())
        epochs_run += 1
        if ppo.target_kl is not None:
            kl = torch.stack(epoch_kl).to(device, torch.get_default_dtype()).mean()
            if accelerator.reduce(kl, "mean").item() > ppo.target_kl:
                break
    # A step can leave infinite weights behind a finite gradient: never save or roll out those.
    raise_if_diverged(accelerator, ~_all_finite(trainable))

    totals = torch.stack(list(stat_sums.values())).tolist() if stat_sums else []
    metrics = {f"losses/{key}": total / count for key, total in zip(stat_sums, totals, strict=True)}
    metrics["losses/grad_norm"] = sums["losses/grad_norm"] / steps if steps else math.nan
    reduced = accelerator.reduce(
        torch.tensor(list(metrics.values()), device=device, dtype=torch.float64), "mean"
    )
    metrics = dict(zip(metrics, reduced.tolist(), strict=True))
    deviation = first_deviation.reshape(1).to(device, torch.float64)
    metrics["debug/first_ratio_deviation"] = _reduce_max(accelerator, deviation)
    metrics["charts/epochs"] = float(epochs_run)
    return metrics | split


def _gradient_split(
    accelerator: Accelerator,
    model: torch.nn.Module,
    mb: Transitions,
    ppo: PPOConfig,
    algorithm: PPO,
) -> dict[str, float]:
    """`glam.ppo.diagnostics.gradient_split` on the micro-batch `mb`, through the policy
    module itself (no DDP hook fires), averaged over processes."""
    module = accelerator.unwrap_model(model)
    device = accelerator.device
    recurrence = 1 if mb.memories is None else ppo.recurrence
    with accelerator.autocast():
        output = policy_output(module, mb, recurrence)
    split = gradient_split(
        *algorithm.loss_inputs(output, mb, device),
        ppo,
        [p for p in module.parameters() if p.requires_grad],
    )
    reduced = accelerator.reduce(
        torch.tensor(list(split.values()), device=device, dtype=torch.float64), "mean"
    )
    return dict(zip(split, reduced.tolist(), strict=True))


def _chunk_loss(
    model: torch.nn.Module,
    mb: Transitions,
    ppo: PPOConfig,
    device: torch.device,
    hooks: Sequence[TrainerHook] = (),
    recurrence: int = 1,
    algorithm: Algorithm | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward a micro-batch and return its loss (the algorithm's, PPO's by default, plus the
    hooks' terms) and the algorithm's stats (a NaN loss if the policy's outputs are not finite:
    the caller stops every process on it).

    With memory, `mb` holds sequences of `recurrence` steps, step by step (`policy_output`);
    the loss is the mean over all their steps."""
    output = policy_output(model, mb, recurrence)
    if not _finite(output):
        return torch.tensor(float("nan")), {}
    algorithm = algorithm or PPO(AlgorithmConfig(), ppo)
    loss, stats = algorithm.loss(output, mb, device)
    for hook in hooks:
        term = hook.loss(output, mb)
        if term is not None:
            loss = loss + term
    return loss, stats


def _finite(output: PolicyOutput) -> torch.Tensor:
    """Scores of the existing candidates and values are finite (absent ones are -inf): one flag
    on the outputs' device, for the caller to read once (a boolean-mask index and two reads made
    the host wait for a GPU three times)."""
    absent = ~output.mask.to(output.logits.device)
    return (torch.isfinite(output.logits) | absent).all() & torch.isfinite(output.values).all()


def _all_finite(parameters: Sequence[torch.Tensor]) -> torch.Tensor:
    """Whether every value of `parameters` is finite: one flag, read once, instead of a read per
    tensor. Under DeepSpeed ZeRO-3 a parameter is an empty placeholder between forwards: its
    shard (`ds_tensor`) is checked, and `raise_if_diverged` combines the processes' flags."""
    flags = [torch.isfinite(getattr(p, "ds_tensor", p)).all() for p in parameters]
    return torch.stack(flags).all() if flags else torch.tensor(True)


def policy_output(model: torch.nn.Module, mb: Transitions, recurrence: int = 1) -> PolicyOutput:
    """The policy's output on the micro-batch `mb`, row for row.

    A policy with memory reads `mb` as sequences of `recurrence` steps laid out step by step
    (`glam.ppo.buffer.sequence_positions`: the sequences' first steps, then their second...):
    one forward per step, the first from the memories the rollout stored, each next from the
    memories the previous one returned, zeroed where the previous step ended an episode.
    """
    if mb.memories is None:
        return model(**mb.observations.inputs())
    count = len(mb) // recurrence
    memory = mb.memories[:count]
    outputs = []
    for step in range(recurrence):
        rows = range(step * count, (step + 1) * count)
        output = model(**policy_inputs(mb.observations.select(rows), memory))
        outputs.append(output)
        ended = mb.dones[step * count : (step + 1) * count].to(output.memory.device)
        memory = output.memory * ~ended[:, None]
    return PolicyOutput.cat(outputs)


@torch.no_grad()
def _recompute_old_logprobs(
    model: torch.nn.Module,
    batch: Transitions,
    order: torch.Tensor,
    minibatch: int,
    micro: int,
    recurrence: int = 1,
) -> None:
    """Replace the rollout's log-probs and values by those of the update's forward pass
    (`order` of sequences of `recurrence` steps, `minibatch` and `micro` counted in sequences),
    and keep the frozen trunk's states a policy returns on the way (a writing policy's, whose
    trunk depends on the answers: `glam.trunk`), for the epochs to run from.

    Chunks follow the first epoch's, so each first-epoch forward sees exactly the inputs (same
    batch composition and padding) it is compared with: in bf16 the ratio is then exactly 1
    before the first step, where batching differences alone would otherwise move it.
    """
    kept: list[Any] = [None] * len(batch)
    for mb_index in order.split(minibatch):
        for chunk in mb_index.split(micro):
            positions = sequence_positions(chunk, recurrence)
            mb = batch.select(positions)
            output = policy_output(model, mb, recurrence)
            actions = mb.actions.to(output.values.device)
            batch.logprobs[positions] = output.dist.log_prob(actions).float().cpu()
            batch.values[positions] = output.values.float().cpu()
            _recompute_token_logprobs(batch, positions, output)
            for position, states in zip(positions.tolist(), output.trunk or (), strict=False):
                kept[position] = states
    if all(states is not None for states in kept):  # a writing policy's trunk, kept on the way
        batch.observations = batch.observations.with_trunk(kept)


def _recompute_token_logprobs(
    batch: Transitions, positions: torch.Tensor, output: PolicyOutput
) -> None:
    """A writing policy's answers keep each token's old log-probability (GRPO's token-level
    ratio): replace them too."""
    tokens = getattr(output, "token_logprobs", None)
    answers = getattr(batch.observations, "answers", None)
    if tokens is not None and answers is not None:
        answers.logprobs[positions] = tokens.float().cpu()


# --------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------


@dataclass
class Training:
    """Everything the loop works with, built by `build_training`."""

    cfg: TrainingRunConfig
    accelerator: Accelerator
    run_dir: Path
    config_yaml: str
    runner: EnvRunner
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    buffer: RolloutBuffer
    state: TrainerState
    logger: MetricsLogger
    progress: ProgressBar
    recompute: bool
    """Recompute old log-probs in the update (reduced precision makes them drift)."""
    cache_trunk: bool
    """The rollout keeps the frozen trunk's states and the update runs from them
    (`ppo.cache_trunk`, resolved)."""
    resumed_from: Path | None
    num_updates: int
    """Updates of the whole run: those done plus those that reach `train.total_frames`."""
    saved: tuple[int, Path] | None = None
    """The update and folder of the newest checkpoint this session wrote or resumed."""
    clock: PhaseClock = field(default_factory=PhaseClock)
    """Seconds per phase of the current update (`time/*` metrics)."""
    memory: torch.Tensor | None = None
    """`(local envs, memory_size)` a policy with memory's memory for each env's next step,
    carried from one rollout to the next; None: zero. Not saved in checkpoints: a session
    (fresh or resumed) starts every env on a new episode, from a zero memory."""
    algorithm: Algorithm = field(default_factory=lambda: PPO(AlgorithmConfig(), PPOConfig()))
    """How the update computes advantages and its loss (`algorithm.name`)."""

    def save(self) -> Path:
        """Write a checkpoint of the current update unless this session already has (every
        process calls it), then the finished episodes' decisions when `train.save_rollouts` is
        on."""
        if self.saved is not None and self.saved[0] == self.state.update:
            return self.saved[1]
        checkpoint = save_checkpoint(
            self.accelerator,
            self.run_dir,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            env_state=self.runner.state_dict(),
            state=self.state,
            config_yaml=self.config_yaml,
            keep=self.cfg.train.keep_checkpoints,
        )
        self.saved = (self.state.update, checkpoint)
        if self.runner.recording:
            self._save_rollouts()
        return checkpoint

    def _save_rollouts(self) -> None:
        records = self.runner.pop_records()
        if not records:
            return
        cfg = self.cfg
        folder = self.run_dir / "rollouts" / f"rank_{self.accelerator.process_index}"
        metadata = {
            "source": "ppo",
            "level": cfg.env.name,
            "action_space": cfg.env.action_space,
            "nbr_obs": cfg.env.nbr_obs,
            "prompt_format": cfg.policy.prompt_format,
            "language": cfg.env.language,
            "update": self.state.update,
        }
        # Overwrite: a run resumed from an older checkpoint replays (and rewrites) later parts.
        write_demos(
            records, folder / f"update_{self.state.update:06d}", metadata=metadata, overwrite=True
        )

    def close(self) -> None:
        """Close the logs, the progress bar and the environments."""
        self.progress.close()
        self.logger.close()
        self.runner.close()


def build_training(
    cfg: TrainingRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    make_policy: PolicyFactory | None = None,
    hooks: Sequence[TrainerHook] = (),
) -> Training:
    """Check the layout and the run folder, pick and check the checkpoint to resume (before any
    model is loaded), build envs (each as the `hooks` wrap it), policy, optimizer and logs, and
    restore the checkpoint."""
    world, rank = accelerator.num_processes, accelerator.process_index
    if make_policy is None:
        if cfg.policy.kind not in LANGUAGE_MODEL_KINDS:
            raise SetupError(
                f"policy.kind={cfg.policy.kind!r} is a baseline: train it with "
                "scripts/train_baseline.py (this trainer's default policy is the language model)"
            )
        make_policy = build_policy
    _check_layout(cfg, world)
    if cfg.policy.kind in LANGUAGE_MODEL_KINDS:  # before the resume check (config.yaml)
        cfg.model.autocast_bf16, why = resolve_autocast_bf16(
            cfg.model.autocast_bf16, accelerator.device
        )
        precision = "bf16 autocast" if cfg.model.autocast_bf16 else "fp32"
        accelerator.print(f"[glam] precision: {precision} ({why})")
    resume_from = open_run_dir(cfg, accelerator, run_dir)
    # The same seed on every process while the policy is drawn: identical initial LoRA and head
    # weights everywhere, with no broadcast to rely on. Then + rank, so processes sample apart.
    if cfg.policy.kind in LANGUAGE_MODEL_KINDS:
        prepare_model_once(accelerator, cfg.model.name_or_path)
    set_seed(cfg.train.seed)
    try:
        policy = make_policy(cfg, resume_from)  # collective under ZeRO-3 (partitioned at init)
    except CheckpointError as error:  # a policy file the checks could not judge (its content)
        raise SetupError(f"cannot resume from {resume_from}: {error}") from None
    set_seed(cfg.train.seed, device_specific=True)
    cache_trunk = resolve_trunk_cache(cfg, policy, accelerator)
    try:
        algorithm = build_algorithm(cfg.algorithm, cfg.ppo)
    except ValueError as error:  # sac: another loop's
        raise SetupError(str(error)) from None
    check_algorithm(cfg, algorithm, policy, world)

    local_envs = cfg.env.num_envs // world
    try:
        runner = make_runner(cfg, policy, hooks, local_envs, rank, algorithm)
    except ValueError as error:  # unknown level, action space or language
        raise SetupError(str(error)) from None
    if algorithm.grouped:
        _note_episode_limit(cfg, accelerator)
    runner.recording = cfg.train.save_rollouts
    if list(runner.action_words) != list(policy.action_words):
        raise SetupError(f"policy actions {policy.action_words} != env's {runner.action_words}")
    if getattr(policy, "memory_size", 0):
        try:
            check_recurrence(cfg.ppo, world)
        except ValueError as error:
            raise SetupError(str(error)) from None

    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable,
        lr=cfg.ppo.lr,
        betas=tuple(cfg.ppo.adam_betas),
        eps=cfg.ppo.adam_eps,
        weight_decay=cfg.ppo.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: lr_factor(update, cfg.ppo, cfg.num_updates)
    )
    # The update accumulates micro-batches into one optimizer step per minibatch: set here, not
    # by the caller, so every entry point runs the same algorithm.
    accelerator.gradient_accumulation_steps = accumulation_steps(cfg.ppo, world)
    _configure_deepspeed(accelerator, cfg)
    model, optimizer = accelerator.prepare(policy, optimizer)

    state, num_updates = TrainerState(world_size=world), cfg.num_updates
    if resume_from is not None:
        state, env_state = restore_training_state(
            accelerator, resume_from, model, optimizer, scheduler
        )
        runner.load_state_dict(env_state)
        # The frames still to collect decide the updates left (`ppo.frames_per_env` may have
        # changed); the learning rate follows this session's config (a resumed run may lower it).
        left = -(-(cfg.train.total_frames - state.frames) // cfg.frames_per_update)
        num_updates = state.update + max(0, left)
        scheduler.lr_lambdas = [lambda update: lr_factor(update, cfg.ppo, num_updates)] * len(
            optimizer.param_groups
        )
        factor = lr_factor(state.update, cfg.ppo, num_updates)
        scheduler.base_lrs = [cfg.ppo.lr] * len(optimizer.param_groups)
        for group in optimizer.param_groups:
            group["lr"] = cfg.ppo.lr * factor
    announce_resume(cfg, accelerator, run_dir, resume_from, state)

    config_yaml = resolved_config_yaml(cfg, accelerator, num_updates)
    logger, progress = open_logs(
        cfg,
        accelerator,
        run_dir,
        config_yaml,
        state,
        num_updates,
        cfg.frames_per_update,
    )
    recompute = cfg.ppo.recompute_logprobs
    if recompute is None:
        recompute = (
            cfg.model.dtype != "float32"
            or cfg.model.autocast_bf16
            or (accelerator.mixed_precision != "no")
            or (cache_trunk and getattr(policy, "keeps_trunk_in_update", False))
        )
    return Training(
        cfg=cfg,
        accelerator=accelerator,
        run_dir=run_dir,
        config_yaml=config_yaml,
        runner=runner,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        buffer=RolloutBuffer(cfg.ppo.frames_per_env, local_envs),
        state=state,
        logger=logger,
        progress=progress,
        recompute=bool(recompute),
        cache_trunk=cache_trunk,
        resumed_from=resume_from,
        num_updates=num_updates,
        saved=None if resume_from is None else (state.update, resume_from),
        algorithm=algorithm,
    )


def prepare_model_once(accelerator: Accelerator, spec: str) -> None:
    """Build the model's local cache (`prepare_model_cache`: an embedded model converted once)
    on one process of each node first, the node's others waiting (collective).

    One per node, not one in all: a node whose cache (`~/.cache/glam`, `GLAM_CACHE`) the main
    node does not share must convert too, and its processes would otherwise all convert at once;
    where nodes share the cache, the conversion's atomic rename lets them write it side by side.
    """
    with accelerator.local_main_process_first():
        prepare_model_cache(spec)


def make_runner(
    cfg: TrainingRunConfig,
    policy: torch.nn.Module,
    hooks: Sequence[TrainerHook],
    num_envs: int,
    rank: int,
    algorithm: Algorithm,
) -> EnvRunner:
    """The envs of this process as the policy reads them: a writing policy's
    (`WrittenEnvRunner`: its prompts, invalid answers and answer statistics), or text prompts
    and candidates, or grids; in groups on the same seeds for a group estimator."""
    common = {
        "num_envs": num_envs,
        "seed": env_seed(cfg.train.seed, rank),
        "tokenizer": getattr(policy, "tokenizer", None),
        "wrap_env": partial(wrap_env, hooks) if hooks else None,
        "group_size": cfg.algorithm.group_size if algorithm.grouped else 1,
    }
    if getattr(policy, "observation_kind", "text") == "written":
        return WrittenEnvRunner(cfg.env, cfg.policy, cfg.generate, **common)
    return EnvRunner(
        cfg.env,
        cfg.policy,
        observation_kind=getattr(policy, "observation_kind", "text"),
        **common,
    )


def _note_episode_limit(cfg: TrainingRunConfig, accelerator: Accelerator) -> None:
    """A group estimator trains on the episodes that end within a rollout: say so when the
    rollout is shorter than the level's step limit (the longest of its first episodes: a mixed
    level's depends on the task)."""
    env, limits = babyai_text.make(cfg.env.name), []
    for seed in range(4):
        env.reset(seed=seed)
        limits.append(env.unwrapped.max_steps)
    env.close()
    limit = max(limits)
    if cfg.ppo.frames_per_env < limit:
        accelerator.print(
            f"[glam] algorithm.name={cfg.algorithm.name}: ppo.frames_per_env="
            f"{cfg.ppo.frames_per_env} is below the level's limit of {limit} steps; episodes "
            "longer than the rollout are cut and not trained on (charts/trained_share says how "
            "many steps are)"
        )


def check_algorithm(
    cfg: TrainingRunConfig, algorithm: Algorithm, policy: torch.nn.Module, world: int
) -> None:
    """What the algorithm needs of the run's layout and policy; an algorithm without a critic
    freezes the policy's value head (nothing trains it; DDP would wait for its gradients).

    Raises:
        SetupError: naming the key to change.
    """
    if not algorithm.grouped:
        return
    local = cfg.env.num_envs // world
    if local % cfg.algorithm.group_size:
        raise SetupError(
            f"algorithm.group_size={cfg.algorithm.group_size} must divide each process's envs, "
            f"env.num_envs / processes = {local}: a group plays on one process"
        )
    if getattr(policy, "memory_size", 0):
        raise SetupError(
            f"algorithm.name={algorithm.name}: the group estimators train policies without memory"
        )
    if not algorithm.uses_value and getattr(policy, "value_head", None) is not None:
        policy.value_head.requires_grad_(False)


def resolve_trunk_cache(
    cfg: TrainingRunConfig, policy: torch.nn.Module, accelerator: Accelerator
) -> bool:
    """Turn the frozen trunk's cache on where `ppo.cache_trunk` asks for it and it applies
    (`glam.trunk`), say once what was decided and why, and record it in `cfg`.

    Raises:
        SetupError: `ppo.cache_trunk=true` where the cache does not apply.
    """
    asked = cfg.ppo.cache_trunk
    if not hasattr(policy, "enable_trunk_cache"):  # a small policy: nothing to cache
        cfg.ppo.cache_trunk = False
        return False
    if asked is False:
        accelerator.print("[glam] trunk cache: off (ppo.cache_trunk=false)")
        return False
    problem = policy.trunk_cache_problem()
    in_update = getattr(policy, "keeps_trunk_in_update", False)
    if problem is None and in_update and cfg.ppo.recompute_logprobs is False:
        problem = (
            "ppo.recompute_logprobs=false: a writing policy keeps its trunk in the update's "
            "first pass, the recomputation of the old log-probabilities"
        )
    if problem is not None:
        if asked:
            raise SetupError(f"ppo.cache_trunk=true, but {problem}")
        accelerator.print(f"[glam] trunk cache: off ({problem})")
        cfg.ppo.cache_trunk = False
        return False
    cut = policy.enable_trunk_cache()
    keeper, runner = (
        ("the update's recomputation", "the epochs run")
        if in_update
        else (
            "the rollout",
            "the update runs",
        )
    )
    if cut.layers is None:
        where = f"the encoder's output; {runner} the decoder only"
    else:
        top = len(cut.layers) - 1
        where = (
            f"the input of layer {cut.first} of 0-{top}; {runner} layers {cut.first}-{top} from it"
        )
    accelerator.print(f"[glam] trunk cache: on ({keeper} keeps {where})")
    cfg.ppo.cache_trunk = True
    return True


def wrap_env(hooks: Sequence[TrainerHook], env: Any) -> Any:
    """`env` as the hooks wrap it, in their order (`TrainerHook.wrap_env`)."""
    for hook in hooks:
        env = hook.wrap_env(env)
    return env


PolicyFactory = Callable[[TrainingRunConfig, "Path | None"], torch.nn.Module]
"""Builds the actor-critic of a run: `(cfg, checkpoint)` -> module, restored from
`checkpoint / "policy"` when resuming. The module maps a batch of observations
(`observation_kind`: `text`, the default, or `grid`; passed as `model(**observations.inputs())`)
to a `PolicyOutput` over its `action_words`, has `save_pretrained(folder)`, and raises
`SetupError` or `CheckpointError` when it cannot be built. A module with a `memory_size` above 0
has memory: it is also passed `memory=` `(batch, memory_size)` and returns the next in
`PolicyOutput.memory` (the module docstring says how it is trained)."""


def build_policy(cfg: TrainingRunConfig, checkpoint: Path | None) -> torch.nn.Module:
    """The language-model actor-critic of the config; with a checkpoint, its trained adapter
    and heads (the default `PolicyFactory`)."""
    try:
        action_words = list(resolve_action_space(cfg.env.action_space).words)
    except ValueError as error:
        raise SetupError(str(error)) from None
    try:
        if cfg.policy.kind == "generate":
            return WritingActorCritic.from_run_config(
                cfg.model,
                cfg.policy,
                cfg.generate,
                cfg.algorithm,
                action_words,
                training_env=cfg.env,
                checkpoint=None if checkpoint is None else checkpoint / "policy",
                trust_remote_code=cfg.model.trust_remote_code,
            )
        if checkpoint is not None:
            # Whether a model's own code may run is the command line's decision, never the
            # checkpoint's; the env record follows this session's config.
            return LLMActorCritic.from_pretrained(
                checkpoint / "policy",
                trust_remote_code=cfg.model.trust_remote_code,
                training_env=cfg.env,
            )
        return LLMActorCritic.from_config(cfg.model, cfg.policy, action_words, training_env=cfg.env)
    except ModelNotFoundError as error:
        raise SetupError(f"model.name_or_path={cfg.model.name_or_path!r}: {error}") from None
    except CheckpointError as error:
        raise SetupError(f"cannot resume: {error}") from None
    # A writing policy on an encoder-decoder model, a warm start's adapter of another shape
    # or missing (`model.lora.init`)...
    except (ValueError, FileNotFoundError) as error:
        raise SetupError(str(error)) from None


def lr_factor(update: int, ppo: PPOConfig, num_updates: int) -> float:
    """Learning-rate multiplier for update `update` (0-based): warm-up, then the schedule."""
    if update < ppo.warmup_updates:
        return (update + 1) / ppo.warmup_updates
    progress = (update - ppo.warmup_updates) / max(1, num_updates - ppo.warmup_updates)
    if ppo.lr_schedule == "linear":
        return max(0.0, 1.0 - progress)
    if ppo.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return 1.0


def open_logs(
    cfg: TrainingRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    config_yaml: str,
    state: TrainerState,
    num_updates: int,
    frames_per_update: int,
    *,
    title: str = "PPO",
) -> tuple[MetricsLogger, ProgressBar]:
    """Write `config.yaml`, open the metrics logs and a progress bar up to the run's last update
    (their output on the main process only), and say when the last update overshoots
    `train.total_frames`.

    `config.yaml` is this session's config, a resumed one's too: the settings a resume changed
    (`glam.runs.lifecycle.changed_settings`) are the run's from now on; each checkpoint keeps the
    config that wrote it. With `train.resume=true` the logs rewind to the checkpoint's update (to
    0 if none was found).
    """
    if accelerator.is_main_process:
        (run_dir / "config.yaml").write_text(config_yaml)
    end = state.frames + (num_updates - state.update) * frames_per_update
    if end > cfg.train.total_frames and num_updates > state.update:
        accelerator.print(
            f"[glam] train.total_frames={cfg.train.total_frames} is not reached in whole updates "
            f"of {frames_per_update} frames: the run stops after update {num_updates}, at "
            f"{end} frames"
        )
    resuming_logs = cfg.train.resume
    logger = MetricsLogger(
        run_dir,
        enabled=accelerator.is_main_process,
        resume_update=state.update if resuming_logs else None,
        resume_frames=state.frames if resuming_logs else None,
        wandb_project=cfg.train.wandb_project if cfg.train.wandb else None,
        config=OmegaConf.to_container(OmegaConf.create(config_yaml)),
    )
    progress = ProgressBar(
        state.frames + (num_updates - state.update) * frames_per_update,
        state.frames,
        enabled=accelerator.is_main_process,
        bar=cfg.train.progress_bar,
        title=title,
    )
    return logger, progress


def _check_layout(cfg: TrainingRunConfig, world: int) -> None:
    if world > MAX_PROCESSES:
        raise SetupError(
            f"{world} processes: at most {MAX_PROCESSES} per run (each process plays its own "
            "10**6 episode seeds of the run's 10**8)"
        )
    if cfg.env.num_envs % world:
        raise SetupError(
            f"env.num_envs={cfg.env.num_envs} is not divisible by the {world} processes: each "
            "process steps the same number of envs; pick a multiple of the process count"
        )
    if cfg.ppo.minibatch_size % world:
        raise SetupError(
            f"ppo.minibatch_size={cfg.ppo.minibatch_size} is not divisible by the {world} "
            "processes (each takes an equal share of every minibatch)"
        )
    local = cfg.ppo.minibatch_size // world
    if cfg.ppo.micro_batch_size and local % min(cfg.ppo.micro_batch_size, local):
        raise SetupError(
            f"ppo.micro_batch_size={cfg.ppo.micro_batch_size} must divide the per-process "
            f"minibatch, ppo.minibatch_size / processes = {local}"
        )


def micro_batch_size(ppo: PPOConfig, world: int) -> int:
    """Transitions per forward/backward chunk on each process."""
    local = ppo.minibatch_size // world
    return min(ppo.micro_batch_size or local, local)


def accumulation_steps(ppo: PPOConfig, world: int) -> int:
    """Micro-batches accumulated into one optimizer step (one minibatch)."""
    return (ppo.minibatch_size // world) // micro_batch_size(ppo, world)


def _configure_deepspeed(accelerator: Accelerator, cfg: TrainingRunConfig) -> None:
    """Give DeepSpeed the batch layout it otherwise reads from a dataloader (we have none)."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    world = accelerator.num_processes
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    ds_config["train_micro_batch_size_per_gpu"] = micro_batch_size(cfg.ppo, world)
    ds_config["gradient_accumulation_steps"] = accumulation_steps(cfg.ppo, world)
    ds_config["train_batch_size"] = cfg.ppo.minibatch_size
    ds_config["gradient_clipping"] = cfg.ppo.max_grad_norm


# --------------------------------------------------------------------------------------------
# Metrics helpers
# --------------------------------------------------------------------------------------------


def log_update(
    logger: MetricsLogger,
    progress: ProgressBar,
    state: TrainerState,
    metrics: dict[str, float],
    summary: str,
) -> None:
    """Write an update's metrics to the logs, move the progress bar and print `summary`."""
    logger.log(state.update, state.frames, state.elapsed_seconds, metrics)
    progress.update(state.frames, metrics["charts/fps"], metrics["charts/success_rate"])
    progress.print(summary)


def checkpoint_due(cfg: TrainingRunConfig, state: TrainerState) -> bool:
    """The update just done is saved: every `train.save_every` updates, and the last one."""
    every = cfg.train.save_every
    return bool(every and state.update % every == 0) or state.frames >= cfg.train.total_frames


def episode_metrics(sums: torch.Tensor) -> dict[str, float]:
    """Success rate, mean return and length from `[count, successes, returns, lengths]` sums
    (NaN when no episode ended)."""
    count, successes, returns, lengths = sums.tolist()
    if count == 0:
        nan = float("nan")
        return {
            "charts/success_rate": nan,
            "charts/episode_return": nan,
            "charts/episode_length": nan,
            "charts/episodes": 0.0,
        }
    return {
        "charts/success_rate": successes / count,
        "charts/episode_return": returns / count,
        "charts/episode_length": lengths / count,
        "charts/episodes": count,
    }


def _global_mean_std(
    accelerator: Accelerator, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    sums = torch.stack(
        [values.sum(), values.square().sum(), torch.tensor(float(values.numel()))]
    ).to(accelerator.device, torch.float64)
    total, total_sq, n = accelerator.reduce(sums, "sum").cpu().tolist()
    mean = total / n
    variance = max(total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1)
    return torch.tensor(mean), torch.tensor(math.sqrt(variance))


def _gathered_explained_variance(accelerator: Accelerator, batch: Transitions) -> float:
    values = accelerator.gather(batch.values.to(accelerator.device))
    returns = accelerator.gather(batch.returns.to(accelerator.device))
    return explained_variance(values.double(), returns.double())


def _reduce_max(accelerator: Accelerator, value: torch.Tensor) -> float:
    return float(accelerator.gather(value.reshape(1)).max().item())


def raise_if_diverged(accelerator: Accelerator, bad: bool | torch.Tensor) -> None:
    """Raise `TrainingDiverged` on every process as soon as `bad` is true on one (collective).

    `bad` may be a flag on the device: one process then reads it once, and several sum it first.
    """
    if accelerator.num_processes == 1:
        flagged = bool(bad)
    else:
        flag = torch.as_tensor(bad, device=accelerator.device).float().reshape(1)
        flagged = accelerator.reduce(flag, "sum").item() > 0
    if flagged:
        raise TrainingDiverged("the PPO loss or its gradient became NaN or infinite")


def _summary_line(state: TrainerState, num_updates: int, metrics: dict[str, float]) -> str:
    if metrics["charts/episodes"]:
        episodes = (
            f"success {metrics['charts/success_rate']:.2f}  "
            f"return {metrics['charts/episode_return']:.2f}  "
        )
    else:
        episodes = "no episode ended in this rollout  "
    return (
        f"update {state.update}/{num_updates}  frames {state.frames}  {episodes}"
        f"policy {metrics['losses/policy']:+.4f}  value {metrics['losses/value']:.4f}  "
        f"entropy {metrics['losses/entropy']:.3f}  kl {metrics['losses/approx_kl']:.4f}  "
        f"rollout {metrics['charts/rollout_fps']:.0f} fps  update {metrics['charts/update_fps']:.0f} fps"
    )
