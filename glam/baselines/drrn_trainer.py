"""DRRN's training loop: Q-learning from a replay buffer with a target network (He et al. 2016).

`train_drrn` reads top to bottom: build everything, then per row of metrics (`drrn.log_every`
frames, the "update" of a DRRN run) act in every local env with softmax (or epsilon-greedy)
exploration, store the transitions, take the TD gradient steps that are due, log, checkpoint.

It shares PPO's run folder: `config.yaml` with its `launch` section, `metrics.csv` and
TensorBoard with the same chart names, `checkpoints/update_NNNNNN/` written atomically (its
`policy/` loads with `DRRNPolicy.from_pretrained`; besides PPO's files, `target.safetensors`,
`drrn_state.json` and each process's replay buffer in `rank_R/replay.*`), `train.resume=true`,
and SIGTERM / SIGUSR1 / SIGINT saving and exiting. Under `accelerate launch` each process steps
`env.num_envs / world_size` envs into a replay buffer of its own and samples
`drrn.batch_size / world_size` transitions per gradient step; DDP averages the gradients, so one
process and N processes run the same algorithm.

Metrics of a row: PPO's `charts/success_rate`, `charts/episode_return`, `charts/episode_length`,
`charts/episodes` (episodes that ended in the row, over all processes), `charts/fps`,
`charts/learning_rate` and `losses/grad_norm`; DRRN's `losses/td` (mean Huber TD loss of the
row's gradient steps; blank before `drrn.learning_starts`), `charts/q_mean` (mean of
max_a Q(s, a) over the states acted in), `charts/replay_size`, `charts/gradient_steps`, and
`charts/temperature` or `charts/epsilon` (the exploration's).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from glam.baselines.config import DRRNConfig
from glam.baselines.demo_transitions import load_demo_transitions
from glam.baselines.drrn import NETWORK_FIELDS, DRRNPolicy
from glam.baselines.replay import ReplayBuffer
from glam.baselines.run_config import BaselineRunConfig
from glam.demos import DemoDatasetError
from glam.envs import MAX_PROCESSES, EnvRunner, env_seed
from glam.offpolicy.rows import train_in_rows
from glam.policy.llm_policy import CheckpointError
from glam.ppo.learner import (
    LearnerTraining,
    StopSignal,
    TrainResult,
    episode_metrics,
    raise_if_diverged,
)
from glam.ppo.rollout import EpisodeStats
from glam.ppo.setup import open_logs
from glam.runs.checkpoint import TrainerState
from glam.runs.errors import SetupError
from glam.runs.lifecycle import (
    open_run_dir,
    raise_on_any,
    restore_training_state,
)

TARGET_FILE = "target.safetensors"
STATE_FILE = "drrn_state.json"


# --------------------------------------------------------------------------------------------
# The math
# --------------------------------------------------------------------------------------------


def td_targets(
    rewards: torch.Tensor, next_values: torch.Tensor, terminals: torch.Tensor, gamma: float
) -> torch.Tensor:
    """TD(0) targets `r + gamma * max_a' Q_target(s', a')`, without the bootstrap where the
    episode terminated. A time-out is not terminal: its `s'` is the final observation, whose
    value the target network estimates like any other's."""
    return rewards + gamma * (~terminals).to(rewards.dtype) * next_values


def next_states(
    dones: torch.Tensor, final_prompts: Sequence[str | None], next_prompts: Sequence[str]
) -> tuple[list[str], torch.Tensor]:
    """The state each transition of a step bootstraps from, and whether it is terminal.

    Args:
        dones: `(envs,)` bool: the episode ended at this step (terminated or timed out).
        final_prompts: per env, the prompt of the final observation of an episode the time
            limit cut at this step, else None (`EnvRunner.final_prompts`).
        next_prompts: the envs' prompts after the step (a new episode's where one ended).

    Returns:
        `(prompts, terminals)`: a time-out's final prompt, else the next prompt; and `(envs,)`
        bool, True where the episode terminated (its next prompt is then never used).
    """
    prompts = [final or prompt for final, prompt in zip(final_prompts, next_prompts, strict=True)]
    timed_out = torch.tensor([final is not None for final in final_prompts])
    return prompts, dones & ~timed_out


def td_loss(q_taken: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Huber loss between Q(s, a) of the actions taken and their TD targets (mean)."""
    return F.smooth_l1_loss(q_taken, targets)


def margin_loss(q_values: torch.Tensor, actions: torch.Tensor, margin: float) -> torch.Tensor:
    """DQfD's large-margin loss on demonstrated states (Hester et al. 2018, eq. 2), mean over
    the rows: `max_a [Q(s, a) + l(a_E, a)] - Q(s, a_E)`, `l` being `margin` for every action
    but the demonstrated `a_E` and 0 for it. Zero where the demonstrated action's value leads
    every other's by `margin`; absent candidates (-inf) never count.

    Args:
        q_values: `(B, C)` Q values, -inf where a candidate is absent.
        actions: `(B,)` long, the demonstrated action of each row.
        margin: `l`, >= 0.
    """
    chosen = q_values.gather(1, actions[:, None])
    bonus = torch.full_like(q_values, margin).scatter(1, actions[:, None], 0.0)
    return ((q_values + bonus).max(dim=1).values - chosen.squeeze(1)).mean()


def epsilon_at(frames: int, cfg: DRRNConfig) -> float:
    """Epsilon of epsilon-greedy exploration after `frames` frames (linear decay)."""
    progress = min(1.0, frames / cfg.epsilon_decay_frames) if cfg.epsilon_decay_frames else 1.0
    return cfg.epsilon_start + progress * (cfg.epsilon_end - cfg.epsilon_start)


def explore(
    q_values: torch.Tensor, mask: torch.Tensor, cfg: DRRNConfig, frames: int
) -> torch.Tensor:
    """The actions to take, `(B,)`: a sample of softmax(Q / temperature), or epsilon-greedy on Q
    (random actions uniform over each row's candidates). Draws from torch's global RNG."""
    if cfg.exploration == "softmax":
        return torch.distributions.Categorical(logits=q_values / cfg.temperature).sample()
    greedy = q_values.argmax(dim=-1)
    counts = mask.sum(dim=-1)
    random_actions = (torch.rand(len(counts)) * counts).long().clamp(max=counts - 1)
    explored = torch.rand(len(counts)) < epsilon_at(frames, cfg)
    return torch.where(explored, random_actions, greedy)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    """What one row of metrics gathers on this process."""

    frames: int = 0
    """Frames of the row, over all processes."""
    episodes: EpisodeStats = field(default_factory=EpisodeStats)
    td_losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    demo_margins: list[float] = field(default_factory=list)
    """With `drrn.demos`: the margin loss of each gradient step's demonstrated rows."""
    demo_agreements: list[float] = field(default_factory=list)
    """With `drrn.demos`: the share of those rows whose greedy action is the demonstrated one."""
    q_max_sum: float = 0.0
    """Sum over the states acted in of max_a Q(s, a)."""
    states: int = 0
    seconds: float = 0.0

    def add(self, step: StepStats) -> None:
        """Keep a gradient step's figures."""
        self.td_losses.append(step.td)
        self.grad_norms.append(step.grad_norm)
        if step.demo_margin is not None:
            self.demo_margins.append(step.demo_margin)
            self.demo_agreements.append(step.demo_agreement)


def train_drrn(
    cfg: BaselineRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    stop: StopSignal | None = None,
) -> TrainResult:
    """Train (or resume) DRRN until `train.total_frames`, a stop signal, or divergence
    (`glam.offpolicy.rows.train_in_rows`).

    A stop signal ends the current row early: it is logged with the frames it has and saved.

    Raises:
        SetupError: the run cannot start (message says why).
        TrainingDiverged: a non-finite TD loss or gradient; the last checkpoint is untouched.
        CheckpointWriteError: a checkpoint could not be written; the last complete one is
            left untouched.
    """
    return train_in_rows(
        cfg,
        accelerator,
        stop,
        lambda: build_drrn_training(cfg, accelerator, run_dir),
        play_and_learn,
        row_metrics,
        _summary_line,
    )


def play_and_learn(t: DRRNTraining, stop: StopSignal) -> Row:
    """Step every local env `steps_per_update` times (fewer on a stop signal), storing each
    transition and taking the TD gradient steps due after each env step."""
    cfg, accelerator = t.cfg, t.accelerator
    if t.demos is not None and t.state.frames == 0:
        pretrain_on_demos(t)
    row, start = Row(), time.perf_counter()
    for _ in range(t.steps_per_update):
        prompts, candidates = t.runner.prompts(), t.runner.candidates()
        t.policy.eval()
        with torch.no_grad():
            output = t.policy(prompts, candidates)
        frames = t.state.frames + row.frames
        actions = explore(output.logits.cpu(), output.mask.cpu(), cfg.drrn, frames)
        rewards, dones, episodes = t.runner.step(actions.tolist())
        next_prompts, terminals = next_states(
            torch.as_tensor(dones), t.runner.final_prompts, t.runner.prompts()
        )
        t.replay.add(
            prompts,
            candidates,
            actions,
            torch.as_tensor(rewards, dtype=torch.float32) * cfg.env.reward_scale,
            next_prompts,
            t.runner.candidates(),
            terminals,
        )
        for episode in episodes:
            if episode is not None:
                row.episodes.add(episode)
        row.q_max_sum += float(output.values.sum())
        row.states += len(prompts)
        row.frames += cfg.env.num_envs
        # Every process computes the same count from the global frames: the same number of
        # gradient steps everywhere, as DDP's collective backward needs.
        frames += cfg.env.num_envs
        due = t.pretrained_steps + int(
            max(0, frames - cfg.drrn.learning_starts) * cfg.drrn.updates_per_step
        )
        while t.gradient_steps < due:
            row.add(td_step(t))
        if stop.requested(accelerator):
            break
    row.seconds = time.perf_counter() - start
    return row


@dataclass
class StepStats:
    """What one gradient step measured."""

    td: float
    grad_norm: float
    demo_margin: float | None = None
    """The margin loss of the batch's demonstrated rows (None without `drrn.demos`)."""
    demo_agreement: float = math.nan
    """The share of those rows whose greedy action is the demonstrated one."""


PRETRAIN_REPORT_EVERY = 500
"""Pre-training steps between two progress lines."""


def pretrain_on_demos(t: DRRNTraining) -> None:
    """DQfD's pre-training: the gradient steps of `drrn.demo_pretrain_steps` not yet taken, on
    batches of demonstrations alone, before a fresh run's first env step; says every
    `PRETRAIN_REPORT_EVERY` steps, and at the end, the margin loss, the greedy agreement with
    the demonstrated actions and the TD loss, averaged over the steps since the last line."""
    total, since = t.cfg.drrn.demo_pretrain_steps, []
    while t.pretrained_steps < total:
        since.append(td_step(t, demo_share=1.0))
        t.pretrained_steps += 1
        if t.pretrained_steps % PRETRAIN_REPORT_EVERY == 0 or t.pretrained_steps == total:
            margin, agreement, td = (
                sum(getattr(step, name) for step in since) / len(since)
                for name in ("demo_margin", "demo_agreement", "td")
            )
            t.accelerator.print(
                f"[glam] drrn.demos: pre-training step {t.pretrained_steps}/{total} (the last "
                f"{len(since)}): margin loss {margin:.3f}, greedy agreement with the "
                f"demonstrations {agreement:.3f}, TD {td:.4f}"
            )
            since = []


def td_step(t: DRRNTraining, demo_share: float | None = None) -> StepStats:
    """One gradient step of the Huber TD loss on a replay sample; every
    `drrn.target_update_every` steps, the target network takes the online weights.

    With `drrn.demos`, `demo_share` of the batch (`drrn.demo_share` unless given; 1 during the
    pre-training) is drawn from the demonstrations, whose rows add `drrn.demo_loss_coef` times
    the margin loss (`margin_loss`) to the TD loss.

    Raises:
        TrainingDiverged: on a non-finite loss or gradient norm (on every process at once).
    """
    cfg, accelerator, device = t.cfg.drrn, t.accelerator, t.accelerator.device
    share = cfg.demo_share if demo_share is None else demo_share
    demos = 0 if t.demos is None else round(t.local_batch_size * share)
    own = t.local_batch_size - demos
    if not demos:
        batch = t.replay.sample(own)
    elif not own:
        batch = t.demos.sample(demos)  # type: ignore[union-attr]  # demos > 0: there are some
    else:
        batch = t.replay.sample(own).join(t.demos.sample(demos))  # type: ignore[union-attr]
    with torch.no_grad():
        next_values = t.target(batch.next_prompts, batch.next_candidates).values
    targets = td_targets(
        batch.rewards.to(device), next_values, batch.terminals.to(device), cfg.gamma
    )
    t.model.train()
    q_values = t.model(batch.prompts, batch.candidates).logits
    actions = batch.actions.to(device)
    q_taken = q_values.gather(1, actions[:, None]).squeeze(1)
    loss = td_loss(q_taken, targets)
    stats = StepStats(td=loss.item(), grad_norm=math.nan)
    if demos:
        demo_q, demo_actions = q_values[-demos:], actions[-demos:]
        margin = margin_loss(demo_q, demo_actions, cfg.demo_margin)
        loss = loss + cfg.demo_loss_coef * margin
        stats.demo_margin = margin.item()
        stats.demo_agreement = (demo_q.argmax(dim=1) == demo_actions).float().mean().item()
    raise_if_diverged(accelerator, not torch.isfinite(loss).item())
    t.optimizer.zero_grad()
    accelerator.backward(loss)
    grad_norm = float(accelerator.clip_grad_norm_(t.model.parameters(), cfg.max_grad_norm))
    raise_if_diverged(accelerator, not math.isfinite(grad_norm))
    t.optimizer.step()
    t.gradient_steps += 1
    if t.gradient_steps % cfg.target_update_every == 0:
        t.target.load_state_dict(t.policy.state_dict())
    stats.grad_norm = grad_norm
    return stats


def row_metrics(t: DRRNTraining, row: Row) -> dict[str, float]:
    """The row's metrics, reduced over processes (PPO's chart names where they mean the same)."""
    accelerator = t.accelerator
    episodes = accelerator.reduce(row.episodes.as_tensor().to(accelerator.device))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    # Every process took the same number of gradient steps and acted in as many states.
    local = [mean(row.td_losses), mean(row.grad_norms), row.q_max_sum / max(row.states, 1)]
    local.append(float(len(t.replay)))
    reduced = accelerator.reduce(
        torch.tensor(local, dtype=torch.float64, device=accelerator.device)
    )
    td, grad_norm, q_mean = (reduced[:3] / accelerator.num_processes).tolist()
    metrics = {
        **episode_metrics(episodes),
        "losses/td": td,
        "losses/grad_norm": grad_norm,
        "charts/q_mean": q_mean,
        "charts/replay_size": float(reduced[3]),
        "charts/gradient_steps": float(t.gradient_steps),
        "charts/learning_rate": t.optimizer.param_groups[0]["lr"],
        "charts/fps": row.frames / row.seconds if row.seconds > 0 else math.nan,
    }
    if t.demos is not None:  # every process drew as many demonstrated rows
        demo = torch.tensor(
            [mean(row.demo_margins), mean(row.demo_agreements)],
            dtype=torch.float64,
            device=accelerator.device,
        )
        margin, agreement = (accelerator.reduce(demo) / accelerator.num_processes).tolist()
        metrics["losses/demo_margin"], metrics["charts/demo_agreement"] = margin, agreement
    if t.cfg.drrn.exploration == "epsilon":
        metrics["charts/epsilon"] = epsilon_at(t.state.frames, t.cfg.drrn)
    else:
        metrics["charts/temperature"] = t.cfg.drrn.temperature
    return metrics


# --------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class DRRNTraining(LearnerTraining[BaselineRunConfig]):
    """Everything the loop works with, built by `build_drrn_training`: every learner's state
    (`LearnerTraining`; `model` is the online network, an update is a row, the scheduler is
    constant, kept so that the checkpoint has PPO's layout) and DRRN's own."""

    policy: DRRNPolicy
    """The online network, unwrapped (acting needs no gradient synchronisation)."""
    target: DRRNPolicy
    replay: ReplayBuffer
    steps_per_update: int
    """Env steps per row (`drrn.log_every` frames over `env.num_envs` envs, rounded up)."""
    local_batch_size: int
    gradient_steps: int = 0
    """Gradient steps taken, the pre-training's included."""
    demos: ReplayBuffer | None = None
    """The demonstrations' transitions (`drrn.demos`), the same on every process."""
    pretrained_steps: int = 0
    """Gradient steps taken on demonstrations alone before the first env step."""

    def write_extra(self, folder: Path) -> None:
        self.replay.save(folder / f"rank_{self.accelerator.process_index}")
        if self.accelerator.is_main_process:
            weights = {
                k: v.detach().cpu().contiguous() for k, v in self.target.state_dict().items()
            }
            save_file(weights, folder / TARGET_FILE)
            state = {
                "gradient_steps": self.gradient_steps,
                "pretrained_steps": self.pretrained_steps,
            }
            (folder / STATE_FILE).write_text(json.dumps(state, indent=1))


def build_drrn_training(
    cfg: BaselineRunConfig, accelerator: Accelerator, run_dir: Path
) -> DRRNTraining:
    """Check the layout and the run folder, pick and check the checkpoint to resume, build envs,
    networks, optimizer, replay buffer and logs, and restore the checkpoint."""
    world, rank = accelerator.num_processes, accelerator.process_index
    _check_drrn_layout(cfg, accelerator)
    resume_from = open_run_dir(cfg, accelerator, run_dir)
    if resume_from is not None:
        _check_same_network(cfg, resume_from)
    demos = _demo_transitions(cfg, accelerator)

    local_envs = cfg.env.num_envs // world
    try:
        runner = EnvRunner(
            cfg.env, cfg.policy, num_envs=local_envs, seed=env_seed(cfg.train.seed, rank)
        )
    except ValueError as error:  # unknown level, action space or language
        raise SetupError(str(error)) from None
    # The same seed on every process while the network is drawn: identical initial weights
    # everywhere, with no broadcast to rely on. Then + rank, so processes explore apart.
    set_seed(cfg.train.seed)
    if resume_from is not None:
        try:
            policy = DRRNPolicy.from_pretrained(resume_from / "policy", training_env=cfg.env)
        except CheckpointError as error:
            raise SetupError(f"cannot resume from {resume_from}: {error}") from None
    else:
        policy = DRRNPolicy.from_config(cfg.drrn, runner.action_words, training_env=cfg.env)
    set_seed(cfg.train.seed, device_specific=True)
    if policy.action_words != runner.action_words:
        raise SetupError(f"policy actions {policy.action_words} != env's {runner.action_words}")
    policy.to(accelerator.device)
    target = copy.deepcopy(policy).requires_grad_(False).eval()

    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.drrn.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    model, optimizer = accelerator.prepare(policy, optimizer)
    replay = ReplayBuffer(max(1, cfg.drrn.replay_size // world))

    steps_per_update = -(-cfg.drrn.log_every // cfg.env.num_envs)
    frames_per_update = steps_per_update * cfg.env.num_envs
    state, gradient_steps, pretrained_steps = TrainerState(world_size=world), 0, 0
    num_updates = -(-cfg.train.total_frames // frames_per_update)
    if resume_from is not None:
        state, env_state = restore_training_state(
            accelerator, resume_from, model, optimizer, scheduler
        )
        runner.load_state_dict(env_state)
        for group in optimizer.param_groups:  # the learning rate follows this session's config
            group["lr"] = cfg.drrn.lr
        gradient_steps, pretrained_steps = _load_drrn_state(
            accelerator, resume_from, target, replay
        )
        left = -(-(cfg.train.total_frames - state.frames) // frames_per_update)
        num_updates = state.update + max(0, left)
    config_yaml, logger, progress = open_logs(
        cfg,
        accelerator,
        run_dir,
        resume_from,
        state,
        num_updates,
        frames_per_update,
        title="DRRN",
    )
    runner.reset()  # every env on a new episode (a resumed one goes on with its seeds)
    return DRRNTraining(
        cfg=cfg,
        accelerator=accelerator,
        run_dir=run_dir,
        config_yaml=config_yaml,
        runner=runner,
        model=model,
        policy=accelerator.unwrap_model(model),
        target=target,
        optimizer=optimizer,
        scheduler=scheduler,
        replay=replay,
        state=state,
        logger=logger,
        progress=progress,
        resumed_from=resume_from,
        num_updates=num_updates,
        steps_per_update=steps_per_update,
        local_batch_size=cfg.drrn.batch_size // world,
        gradient_steps=gradient_steps,
        saved=None if resume_from is None else (state.update, resume_from),
        demos=demos,
        pretrained_steps=pretrained_steps,
    )


def _demo_transitions(cfg: BaselineRunConfig, accelerator: Accelerator) -> ReplayBuffer | None:
    """`drrn.demos`' transitions (None without), said where they come from."""
    drrn = cfg.drrn
    if not drrn.demos:
        return None
    try:
        demos, episodes = load_demo_transitions(drrn, cfg.env, cfg.policy.prompt_format)
    except DemoDatasetError as error:
        raise SetupError(f"drrn.demos={drrn.demos!r}: {error}") from None
    kept = f", {drrn.demo_held_out:.0%} of its episodes held out" if drrn.demo_held_out else ""
    accelerator.print(
        f"[glam] drrn.demos: {len(demos)} transitions of {episodes} demonstrated episodes from "
        f"{drrn.demos}{kept}; {drrn.demo_share:.0%} of each TD batch, margin loss "
        f"{drrn.demo_margin} x {drrn.demo_loss_coef}, {drrn.demo_pretrain_steps} steps on them "
        "alone first"
    )
    return demos


def _check_drrn_layout(cfg: BaselineRunConfig, accelerator: Accelerator) -> None:
    world = accelerator.num_processes
    if cfg.policy.kind != "drrn":
        raise SetupError(f"policy.kind={cfg.policy.kind!r}: train_drrn trains policy.kind=drrn")
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise SetupError(
            "DRRN trains in one process or with DDP (configs/accelerate/multi_cpu.yaml, "
            "multi_gpu.yaml): its network is small, DeepSpeed's sharding is for language models"
        )
    if cfg.policy.prompt_format != "glam":
        raise SetupError(
            f"policy.prompt_format={cfg.policy.prompt_format!r}: DRRN reads GLAM's text prompts "
            "(`glam`); the chat format needs a language model's template"
        )
    if cfg.train.save_rollouts:
        raise SetupError(
            "train.save_rollouts=true saves a PPO run's decisions for behavioural cloning; "
            "DRRN runs do not write them"
        )
    if world > MAX_PROCESSES:
        raise SetupError(f"{world} processes: at most {MAX_PROCESSES} per run")
    for name, value in (
        ("env.num_envs", cfg.env.num_envs),
        ("drrn.batch_size", cfg.drrn.batch_size),
        ("drrn.replay_size", cfg.drrn.replay_size),
    ):
        if value % world:
            raise SetupError(
                f"{name}={value} is not divisible by the {world} processes: each process takes "
                "an equal share; pick a multiple of the process count"
            )


def _check_same_network(cfg: BaselineRunConfig, checkpoint: Path) -> None:
    """Refuse to resume a checkpoint whose network has other sizes."""
    saved = OmegaConf.load(checkpoint / "config.yaml").get("drrn") or {}
    changed = [
        f"drrn.{name}: {saved.get(name)!r} -> {getattr(cfg.drrn, name)!r}"
        for name in NETWORK_FIELDS
        if saved.get(name) != getattr(cfg.drrn, name)
    ]
    if changed:
        raise SetupError(
            f"cannot resume {checkpoint}: the network's sizes differ from the run's:\n  "
            + "\n  ".join(changed)
        )


def _load_drrn_state(
    accelerator: Accelerator, checkpoint: Path, target: DRRNPolicy, replay: ReplayBuffer
) -> tuple[int, int]:
    """Restore the target network, this process's replay buffer and the gradient step counts
    (all, and those of the pre-training on demonstrations); a missing or malformed file stops
    every process with a message (collective)."""
    problem, gradient_steps, pretrained_steps = None, 0, 0
    try:
        for name in (TARGET_FILE, STATE_FILE):
            if not (checkpoint / name).is_file():
                raise ValueError(f"{name} is missing")
        target.load_state_dict(load_file(checkpoint / TARGET_FILE))
        counts = json.loads((checkpoint / STATE_FILE).read_text())
        gradient_steps = int(counts["gradient_steps"])
        pretrained_steps = int(counts.get("pretrained_steps", 0))  # none before drrn.demos
        replay.load(checkpoint / f"rank_{accelerator.process_index}")
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, SafetensorError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        problem = f"cannot resume from {checkpoint}: {lines[0]}"
    raise_on_any(accelerator, problem)
    return gradient_steps, pretrained_steps


def _summary_line(t: DRRNTraining, metrics: dict[str, float]) -> str:
    if metrics["charts/episodes"]:
        episodes = (
            f"success {metrics['charts/success_rate']:.2f}  "
            f"return {metrics['charts/episode_return']:.2f}  "
        )
    else:
        episodes = "no episode ended in this row  "
    td = metrics["losses/td"]
    learning = f"td {td:.4f}  " if math.isfinite(td) else "no TD step yet  "
    return (
        f"update {t.state.update}/{t.num_updates}  frames {t.state.frames}  {episodes}"
        f"{learning}q {metrics['charts/q_mean']:.3f}  gradient steps {t.gradient_steps}  "
        f"{metrics['charts/fps']:.0f} fps"
    )
