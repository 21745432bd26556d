"""Online PPO fine-tuning of a language-model actor-critic in BabyAI-Text.

`train` reads top to bottom like CleanRL's `ppo.py`: build everything (`glam.ppo.setup`), then
per update collect a rollout, compute advantages, run the PPO epochs (`glam.ppo.update`), log,
checkpoint. The advantages and the loss are
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

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from glam.envs import EnvRunner
from glam.policy.observations import new_episodes_forget, policy_inputs
from glam.policy.output import PolicyOutput
from glam.ppo.buffer import RolloutBuffer, Transitions
from glam.ppo.hooks import TrainerHook
from glam.ppo.learner import (
    StopSignal,
    TrainResult,
    checkpoint_due,
    episode_metrics,
    log_update,
    raise_if_diverged,
)
from glam.ppo.losses import explained_variance
from glam.ppo.rollout import EpisodeStats
from glam.ppo.run_config import PPORunConfig
from glam.ppo.setup import PolicyFactory, build_training
from glam.ppo.timing import PhaseClock, peak_rss_mib
from glam.ppo.update import finite_output, ppo_update
from glam.runs.checkpoint import TrainerState

__all__ = ["Rollout", "collect_rollout", "train"]


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


def train(
    cfg: PPORunConfig,
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
            learning_rate = t.optimizer.param_groups[0]["lr"]  # the policy's
            rates = {}
            for group in t.optimizer.param_groups:
                if group.get("role") == "value":  # `ppo.value_lr` or a critic's warm-up
                    rates["charts/value_learning_rate"] = group["lr"]
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
                value_only=t.state.update < cfg.ppo.value_warmup_updates,
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
                **rates,
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
    cfg: PPORunConfig,
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
            raise_if_diverged(accelerator, ~finite_output(batch))
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


def _gathered_explained_variance(accelerator: Accelerator, batch: Transitions) -> float:
    values = accelerator.gather(batch.values.to(accelerator.device))
    returns = accelerator.gather(batch.returns.to(accelerator.device))
    return explained_variance(values.double(), returns.double())


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
