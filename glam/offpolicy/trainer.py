"""Discrete SAC's training loop (`algorithm.name=sac`): a scoring policy learns from a replay
buffer of its own steps, every frame used many times (SAC-GLAM's learner).

`train_sac` reads top to bottom: build everything, then per row of metrics (`sac.log_every`
frames, the "update" of a SAC run) act in every local env by sampling the policy, store each
step, and every `sac.update_every` env steps take the gradient steps due (`sac.replay_ratio`
per frame after `sac.learning_starts`); log; checkpoint.

One gradient step (`sac_step`), on `sac.batch_size` n-step transitions from the replay: the
target Q heads value what followed each window (`soft_state_values` under the current policy),
the twin Q heads regress on the n-step targets, the policy minimises the soft actor loss
against the Q heads, the temperature follows the policy's entropy toward its target, and the
target heads take `sac.tau` of the heads (`glam.offpolicy.sac`). The Q heads read the policy's
state representation (`PolicyOutput.features`: what its value head reads), as a fixed input
unless `sac.critic_trains_features`; the policy's own value head is not trained. Where LoRA adapts
the top layers only, the replayed observations run from their frozen trunk's kept states
(`sac.cache_trunk`, `glam.offpolicy.trunk_cache`).

It shares PPO's run folder: `config.yaml`, `metrics.csv` and TensorBoard with PPO's chart names
where they mean the same, `checkpoints/update_NNNNNN/` written atomically, whose `policy/` is the
policy's own (evaluation and `compare_runs` read it unchanged); besides PPO's files,
`sac_heads.safetensors` (the Q heads, their targets and log(alpha)), `sac_state.json` and each
process's replay buffer in `rank_R/replay/` (the buffer is saved, so a resumed run goes on with
it: a checkpoint's size grows with `sac.replay_size`). Under `accelerate launch` each process
steps `env.num_envs / world_size` envs into a replay of its own and samples `sac.batch_size /
world_size` transitions per gradient step; DDP averages the gradients.

Metrics of a row: `losses/critic`, `losses/actor`, `losses/temperature`, `losses/td_error`
(mean |Q(s, a) - y| of the row's gradient steps), `losses/entropy` (the policy's on the replayed
states), `losses/grad_norm` and `losses/critic_grad_norm`, `charts/q_mean`, `charts/alpha`,
`charts/replay_size`, `charts/gradient_steps`, `charts/updates_per_frame`, with the trunk cache
`memory/trunk_cache_mib` and `charts/trunk_cache_hit_rate` (the replayed observations found in
it), and PPO's episode charts and `charts/fps`.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from glam.envs import MAX_PROCESSES, EnvRunner, env_seed
from glam.offpolicy.hindsight import HindsightBuffer, Step, cat_batches, is_goto
from glam.offpolicy.replay import ReplayBuffer, ReplayError
from glam.offpolicy.rows import train_in_rows
from glam.offpolicy.run_config import SacRunConfig
from glam.offpolicy.sac import (
    actor_loss,
    critic_loss,
    critic_targets,
    policy_entropy,
    polyak_update,
    soft_state_values,
    temperature_loss,
)
from glam.offpolicy.trunk_cache import TrunkCache
from glam.policy.heads import mlp, run_fp32
from glam.policy.observations import Observations, policy_inputs
from glam.policy.output import PolicyOutput
from glam.ppo.learner import (
    LearnerTraining,
    StopSignal,
    TrainResult,
    episode_metrics,
    raise_if_diverged,
)
from glam.ppo.rollout import EpisodeStats
from glam.ppo.setup import build_run_policy, open_logs
from glam.runs.checkpoint import TrainerState
from glam.runs.errors import SetupError
from glam.runs.lifecycle import (
    open_run_dir,
    raise_on_any,
    restore_training_state,
)

__all__ = ["SacAgent", "TwinCritic", "train_sac"]

HEADS_FILE = "sac_heads.safetensors"
STATE_FILE = "sac_state.json"
REPLAY_DIR = "replay"

PolicyFactory = Callable[[SacRunConfig, Path | None], nn.Module]


class TwinCritic(nn.Module):
    """Two Q heads on a state representation: `(B, F)` -> two `(B, A)` (fp32 MLPs)."""

    def __init__(self, features: int, actions: int, hidden_sizes: list[int]) -> None:
        super().__init__()
        self.q1 = mlp(features, hidden_sizes, actions, "relu")
        self.q2 = mlp(features, hidden_sizes, actions, "relu")

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        return run_fp32(self.q1, features), run_fp32(self.q2, features)


class SacAgent(nn.Module):
    """The policy, its Q heads and log(alpha): one module for one optimizer and one DDP wrap.
    Saved as the policy alone (`save_pretrained`): the checkpoint's `policy/` is the policy's."""

    def __init__(
        self, policy: nn.Module, critics: TwinCritic, initial_alpha: float, train_features: bool
    ) -> None:
        super().__init__()
        self.policy, self.critics = policy, critics
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial_alpha)))
        self.train_features = train_features

    def forward(self, **inputs: object) -> tuple[PolicyOutput, Tensor, Tensor]:
        output = self.policy(**inputs)
        features = output.features if self.train_features else output.features.detach()
        q1, q2 = self.critics(features)
        return output, q1, q2

    def save_pretrained(self, path: str | Path) -> None:
        self.policy.save_pretrained(path)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    """What one row of metrics gathers on this process."""

    frames: int = 0
    """Frames of the row, over all processes."""
    episodes: EpisodeStats = field(default_factory=EpisodeStats)
    stats: dict[str, list[float]] = field(default_factory=dict)
    """Each gradient step's statistics, by metric name."""
    seconds: float = 0.0

    def add(self, stats: dict[str, float]) -> None:
        for name, value in stats.items():
            self.stats.setdefault(name, []).append(value)


def train_sac(
    cfg: SacRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    stop: StopSignal | None = None,
    *,
    make_policy: PolicyFactory,
) -> TrainResult:
    """Train (or resume) the policy `make_policy` builds by discrete SAC until
    `train.total_frames`, a stop signal, or divergence (`glam.offpolicy.rows.train_in_rows`).

    Raises:
        SetupError: the run cannot start (message says why).
        TrainingDiverged: a non-finite loss or gradient; the last checkpoint is untouched.
        CheckpointWriteError: a checkpoint could not be written; the last complete one stays.
    """
    return train_in_rows(
        cfg,
        accelerator,
        stop,
        lambda: build_sac_training(cfg, accelerator, run_dir, make_policy),
        play_and_learn,
        row_metrics,
        _summary_line,
    )


def play_and_learn(t: SacTraining, stop: StopSignal) -> Row:
    """Step every local env `steps_per_update` times (fewer on a stop signal), storing each
    step, and every `sac.update_every` steps take the gradient steps due."""
    cfg, sac, accelerator = t.cfg, t.cfg.sac, t.accelerator
    row, start = Row(), time.perf_counter()
    for _ in range(t.steps_per_update):
        observations = t.runner.observations()
        t.agent.eval()
        with torch.no_grad():
            output = t.agent.policy(**policy_inputs(observations))
        raise_if_diverged(accelerator, not bool(torch.isfinite(output.logits[output.mask]).all()))
        if t.trunks is not None:
            t.trunks.keep(observations, output.trunk)
        actions = output.dist.sample().cpu()
        missions = list(t.runner.missions)  # the episodes' goals, before the envs reset
        rewards, dones, episodes = t.runner.step(actions.tolist())
        if t.hindsight is not None:
            _remember(t, observations, actions, dones, missions)
        final_envs, finals = t.runner.final_observations()
        truncated = torch.zeros(len(dones), dtype=torch.bool)
        truncated[final_envs] = True
        t.replay.add(
            observations,
            actions,
            torch.as_tensor(rewards, dtype=torch.float32) * cfg.env.reward_scale,
            torch.as_tensor(dones) & ~truncated,
            truncated,
            _followed_by(t.runner.observations(), final_envs, finals),
        )
        for episode in episodes:
            if episode is not None:
                row.episodes.add(episode)
        row.frames += cfg.env.num_envs
        t.env_steps += 1
        # Every process computes the same count from the global frames: the same number of
        # gradient steps everywhere, as DDP's collective backward needs.
        frames = t.state.frames + row.frames
        if t.env_steps % sac.update_every == 0:
            due = int(max(0, frames - sac.learning_starts) * sac.replay_ratio)
            while t.gradient_steps < due:
                row.add(sac_step(t))
        if stop.requested(accelerator):
            break
    row.seconds = time.perf_counter() - start
    return row


def _remember(
    t: SacTraining, observations: Observations, actions: Tensor, dones: object, missions: list[str]
) -> None:
    """Add each env's step to its episode; relabel the episodes that ended (`sac.her`)."""
    for env in range(len(observations)):
        step = Step(observations.select([env]), int(actions[env]), tuple(t.runner.seen[env]))
        t.episodes[env].append(step)
        if dones[env]:
            t.hindsight.add_episode(t.episodes[env], missions[env])
            t.episodes[env] = []


def _followed_by(after: Observations, final_envs: list[int], finals: Observations | None):  # noqa: ANN202
    """What followed each env's step: the observation after it, or for an episode cut by its
    time limit the final observation (the env has reset since)."""
    if finals is None:
        return after
    positions = list(range(len(after)))
    for row, env in enumerate(final_envs):
        positions[env] = len(after) + row
    return type(after).cat([after, finals]).select(positions)


def sac_step(t: SacTraining) -> dict[str, float]:
    """One gradient step on a replay sample (see the module docstring); its statistics.

    Raises:
        TrainingDiverged: on a non-finite loss or gradient norm (on every process at once).
    """
    sac, accelerator, device = t.cfg.sac, t.accelerator, t.accelerator.device
    relabelled = 0
    if t.hindsight is not None and len(t.hindsight):
        relabelled = round(t.local_batch_size * sac.her_ratio)
    batch = t.replay.sample(t.local_batch_size - relabelled, sac.gamma, sac.n_step)
    if relabelled:
        batch = cat_batches(batch, t.hindsight.sample(relabelled))
    next_obs, obs = batch.next_obs, batch.obs
    if t.trunks is not None:  # text observations: the policy is a language model's
        next_obs = t.trunks.attach(t.agent.policy, next_obs)  # type: ignore[arg-type]
        obs = t.trunks.attach(t.agent.policy, obs)  # type: ignore[arg-type]
    alpha = t.agent.log_alpha.detach().exp()
    with torch.no_grad():
        following = t.agent.policy(**policy_inputs(next_obs))
        q1_next, q2_next = t.target(following.features)
        next_values = soft_state_values(following.logits, q1_next, q2_next, following.mask, alpha)
        targets = critic_targets(
            batch.returns.to(device),
            batch.discounts.to(device),
            batch.bootstrap.to(device),
            next_values,
        )
    t.model.train()
    output, q1, q2 = t.model(**policy_inputs(obs))
    actions = batch.actions.to(device)
    entropy = policy_entropy(output.logits, output.mask)
    losses = {
        "critic": critic_loss(q1, q2, actions, targets),
        "actor": actor_loss(output.logits, q1, q2, output.mask, alpha),
        "temperature": temperature_loss(t.agent.log_alpha, entropy, t.target_entropy),
    }
    loss = sum(losses.values())
    raise_if_diverged(accelerator, not torch.isfinite(loss).item())
    t.optimizer.zero_grad()
    accelerator.backward(loss)
    policy_norm = float(accelerator.clip_grad_norm_(t.policy_parameters, sac.max_grad_norm))
    critic_norm = float(
        accelerator.clip_grad_norm_(list(t.agent.critics.parameters()), sac.max_grad_norm)
    )
    raise_if_diverged(accelerator, not (math.isfinite(policy_norm) and math.isfinite(critic_norm)))
    t.optimizer.step()
    polyak_update(t.target.parameters(), t.agent.critics.parameters(), sac.tau)
    t.gradient_steps += 1
    taken = torch.minimum(q1, q2).gather(1, actions[:, None])[:, 0].detach()
    return {
        **{f"losses/{name}": value.item() for name, value in losses.items()},
        "losses/td_error": (q1.gather(1, actions[:, None])[:, 0] - targets).abs().mean().item(),
        "losses/entropy": entropy.mean().item(),
        "losses/grad_norm": policy_norm,
        "losses/critic_grad_norm": critic_norm,
        "charts/q_mean": float(taken.mean()),
        "charts/her_share": relabelled / t.local_batch_size,
    }


STEP_METRICS = (
    "losses/critic",
    "losses/actor",
    "losses/temperature",
    "losses/td_error",
    "losses/entropy",
    "losses/grad_norm",
    "losses/critic_grad_norm",
    "charts/q_mean",
    "charts/her_share",
)
"""The gradient steps' statistics, as a row's means (blank before the first step)."""


def row_metrics(t: SacTraining, row: Row) -> dict[str, float]:
    """The row's metrics, reduced over processes (PPO's chart names where they mean the same)."""
    accelerator = t.accelerator
    episodes = accelerator.reduce(row.episodes.as_tensor().to(accelerator.device))
    # Every process took the same number of gradient steps: their means average over processes.
    local = [
        sum(row.stats[name]) / len(row.stats[name]) if row.stats.get(name) else math.nan
        for name in STEP_METRICS
    ]
    local += [float(len(t.hindsight) if t.hindsight is not None else 0), float(len(t.replay))]
    reduced = accelerator.reduce(
        torch.tensor(local, dtype=torch.float64, device=accelerator.device)
    ).tolist()
    means = [value / accelerator.num_processes for value in reduced[:-2]]
    frames = t.state.frames
    trunk_metrics = {}
    if t.trunks is not None:  # this process's, as PPO's memory/ metrics
        trunk_metrics = {
            "memory/trunk_cache_mib": t.trunks.nbytes / 2**20,
            "charts/trunk_cache_hit_rate": t.trunks.take_stats().hit_rate,
        }
    return {
        **episode_metrics(episodes),
        **dict(zip(STEP_METRICS, means, strict=True)),
        "charts/alpha": float(t.agent.log_alpha.detach().exp()),
        "charts/replay_size": reduced[-1],
        **({"charts/her_size": reduced[-2]} if t.hindsight is not None else {}),
        "charts/gradient_steps": float(t.gradient_steps),
        "charts/updates_per_frame": t.gradient_steps / frames if frames else math.nan,
        "charts/learning_rate": t.cfg.sac.actor_lr,
        "charts/fps": row.frames / row.seconds if row.seconds > 0 else math.nan,
        **trunk_metrics,
    }


def _summary_line(t: SacTraining, metrics: dict[str, float]) -> str:
    if metrics["charts/episodes"]:
        episodes = (
            f"success {metrics['charts/success_rate']:.2f}  "
            f"return {metrics['charts/episode_return']:.2f}  "
        )
    else:
        episodes = "no episode ended in this row  "
    critic = metrics["losses/critic"]
    learning = (
        f"critic {critic:.4f}  entropy {metrics['losses/entropy']:.3f}  "
        if math.isfinite(critic)
        else "no gradient step yet  "
    )
    return (
        f"update {t.state.update}/{t.num_updates}  frames {t.state.frames}  {episodes}"
        f"{learning}alpha {metrics['charts/alpha']:.3f}  gradient steps {t.gradient_steps}  "
        f"{metrics['charts/fps']:.0f} fps"
    )


# --------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SacTraining(LearnerTraining[SacRunConfig]):
    """Everything the loop works with, built by `build_sac_training`: every learner's state
    (`LearnerTraining`; an update is a row, the scheduler is constant, kept so that the
    checkpoint has PPO's layout) and SAC's own."""

    agent: SacAgent
    """The agent (`model`), unwrapped (acting needs no gradient synchronisation)."""
    target: TwinCritic
    replay: ReplayBuffer
    steps_per_update: int
    """Env steps per row (`sac.log_every` frames over `env.num_envs` envs, rounded up)."""
    local_batch_size: int
    target_entropy: float
    policy_parameters: list[nn.Parameter]
    gradient_steps: int = 0
    env_steps: int = 0
    """Steps of the local envs in this session (the bursts of gradient steps follow it)."""
    hindsight: HindsightBuffer | None = None
    """The relabelled transitions (`sac.her`); None: no hindsight relabelling."""
    trunks: TrunkCache | None = None
    """The frozen trunk's kept states (`sac.cache_trunk`); None: off."""
    episodes: list[list[Step]] = field(default_factory=list)
    """With `sac.her`: each local env's episode so far."""

    def write_extra(self, folder: Path) -> None:
        self.replay.save(folder / f"rank_{self.accelerator.process_index}" / REPLAY_DIR)
        if self.accelerator.is_main_process:
            save_file(_heads_state(self.agent, self.target), folder / HEADS_FILE)
            state = {
                "gradient_steps": self.gradient_steps,
                "features": _features(self.agent.critics),
            }
            (folder / STATE_FILE).write_text(json.dumps(state, indent=1))


def build_sac_training(
    cfg: SacRunConfig, accelerator: Accelerator, run_dir: Path, make_policy: PolicyFactory
) -> SacTraining:
    """Check the layout and the run folder, pick and check the checkpoint to resume, build envs,
    the policy and its Q heads, the optimizer, the replay buffer and the logs, and restore the
    checkpoint."""
    world, rank = accelerator.num_processes, accelerator.process_index
    _check_sac_layout(cfg, accelerator)
    resume_from = open_run_dir(cfg, accelerator, run_dir)
    local_envs = cfg.env.num_envs // world
    set_seed(cfg.train.seed)  # the same initial weights on every process
    policy = build_run_policy(cfg, accelerator, make_policy, resume_from)
    try:
        runner = EnvRunner(
            cfg.env,
            cfg.policy,
            num_envs=local_envs,
            seed=env_seed(cfg.train.seed, rank),
            tokenizer=getattr(policy, "tokenizer", None),
            observation_kind=getattr(policy, "observation_kind", "text"),
        )
    except ValueError as error:  # unknown level, action space or language
        raise SetupError(str(error)) from None
    if list(runner.action_words) != list(policy.action_words):
        raise SetupError(f"policy actions {policy.action_words} != env's {runner.action_words}")
    for name in ("value_head", "critic"):  # the policy's own critic: SAC's Q heads replace it
        if isinstance(getattr(policy, name, None), nn.Module):
            getattr(policy, name).requires_grad_(False)
    policy.to(accelerator.device)
    trunks = _trunk_cache(cfg, policy, accelerator, resumed=resume_from is not None)
    runner.reset()
    features, saved_steps = _feature_size(policy, runner), 0
    critics = TwinCritic(features, len(runner.action_words), list(cfg.sac.critic_hidden_sizes))
    agent = SacAgent(policy, critics, cfg.sac.initial_alpha, cfg.sac.critic_trains_features)
    agent.to(accelerator.device)
    target = copy.deepcopy(critics).requires_grad_(False)
    replay = ReplayBuffer(max(1, cfg.sac.replay_size // cfg.env.num_envs), local_envs)
    if resume_from is not None:
        saved_steps = _load_sac_state(accelerator, resume_from, agent, target, features)
        replay = _load_replay(accelerator, resume_from, replay)
    set_seed(cfg.train.seed, device_specific=True)  # then processes sample apart

    policy_parameters = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(
        [
            {"params": policy_parameters, "lr": cfg.sac.actor_lr},
            {"params": list(critics.parameters()), "lr": cfg.sac.critic_lr},
            {"params": [agent.log_alpha], "lr": cfg.sac.alpha_lr},
        ]
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    model, optimizer = accelerator.prepare(agent, optimizer)

    steps_per_update = -(-cfg.sac.log_every // cfg.env.num_envs)
    frames_per_update = steps_per_update * cfg.env.num_envs
    state = TrainerState(world_size=world)
    num_updates = -(-cfg.train.total_frames // frames_per_update)
    if resume_from is not None:
        state, env_state = restore_training_state(
            accelerator, resume_from, model, optimizer, scheduler
        )
        runner.load_state_dict(env_state)
        runner.reset()
        for group, lr in zip(
            optimizer.param_groups,
            (cfg.sac.actor_lr, cfg.sac.critic_lr, cfg.sac.alpha_lr),
            strict=True,
        ):
            group["lr"] = lr  # the learning rates follow this session's config
        left = -(-(cfg.train.total_frames - state.frames) // frames_per_update)
        num_updates = state.update + max(0, left)
        accelerator.print(
            f"[glam] the replay buffer goes on from the checkpoint: {len(replay)} transitions "
            "on this process"
        )
    config_yaml, logger, progress = open_logs(
        cfg,
        accelerator,
        run_dir,
        resume_from,
        state,
        num_updates,
        frames_per_update,
        title="SAC",
    )
    hindsight = None
    if cfg.sac.her:
        hindsight = _hindsight_buffer(cfg, runner, rank)
        if resume_from is not None:
            accelerator.print(
                "[glam] sac.her: the relabelled transitions are not in the checkpoint; the "
                "buffer refills from this session's episodes"
            )
    return SacTraining(
        cfg=cfg,
        accelerator=accelerator,
        run_dir=run_dir,
        config_yaml=config_yaml,
        runner=runner,
        model=model,
        agent=accelerator.unwrap_model(model),
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
        local_batch_size=cfg.sac.batch_size // world,
        target_entropy=cfg.sac.target_entropy_scale * math.log(len(runner.action_words)),
        policy_parameters=policy_parameters,
        gradient_steps=saved_steps,
        saved=None if resume_from is None else (state.update, resume_from),
        hindsight=hindsight,
        episodes=[[] for _ in range(local_envs)],
        trunks=trunks,
    )


def _trunk_cache(
    cfg: SacRunConfig, policy: nn.Module, accelerator: Accelerator, *, resumed: bool
) -> TrunkCache | None:
    """Turn the policy's trunk cache on where `sac.cache_trunk` asks for it and it applies,
    say once what was decided, and record it in `cfg` (its config.yaml).

    Raises:
        SetupError: `sac.cache_trunk=true` where the cache does not apply.
    """
    sac = cfg.sac
    asked = sac.cache_trunk
    if not hasattr(policy, "enable_trunk_cache"):  # a small policy: nothing to keep
        sac.cache_trunk = False
        return None
    if asked is False:
        accelerator.print("[glam] trunk cache: off (sac.cache_trunk=false)")
        return None
    problem = policy.trunk_cache_problem()
    if problem is None and sac.trunk_cache_mib == 0:
        problem = "sac.trunk_cache_mib=0"
    if problem is not None:
        if asked:
            raise SetupError(f"sac.cache_trunk=true, but {problem}")
        accelerator.print(f"[glam] trunk cache: off ({problem})")
        sac.cache_trunk = False
        return None
    policy.enable_trunk_cache()
    sac.cache_trunk = True
    accelerator.print(
        f"[glam] trunk cache: on; a gradient step runs the adapted layers only, from the frozen "
        f"trunk's states of each replayed observation (kept in {sac.trunk_cache_dtype}, at most "
        f"{sac.trunk_cache_mib:g} MiB per process, the least recently used dropped first"
        + ("; empty at resume: it refills as the run replays)" if resumed else ")")
    )
    dtype = torch.bfloat16 if sac.trunk_cache_dtype == "bfloat16" else None
    return TrunkCache(round(sac.trunk_cache_mib * 2**20), dtype)


def _hindsight_buffer(cfg: SacRunConfig, runner: EnvRunner, rank: int) -> HindsightBuffer:
    """`sac.her`'s buffer, for a level whose envs all play GoTo missions with one step limit.

    Raises:
        SetupError: another kind of mission, or envs with different step limits.
    """
    missions = sorted(set(runner.missions))
    if not all(is_goto(mission) for mission in missions):
        raise SetupError(
            f"sac.her relabels GoTo missions (go to the COLOR TYPE); {cfg.env.name} gives "
            f"{missions[:3]}: set sac.her=false"
        )
    limits = {env.unwrapped.max_steps for env in runner.envs.envs}
    if len(limits) != 1:
        raise SetupError(f"sac.her needs one step limit for the level's episodes, got {limits}")
    return HindsightBuffer(
        cfg.sac.her_size,
        goals=cfg.sac.her_goals,
        gamma=cfg.sac.gamma,
        n=cfg.sac.n_step,
        max_steps=limits.pop(),
        reward_scale=cfg.env.reward_scale,
        seed=cfg.train.seed * 1000 + rank,
    )


def _feature_size(policy: nn.Module, runner: EnvRunner) -> int:
    """The width of the policy's state representation, from one forward on the envs' first
    observations.

    Raises:
        SetupError: a policy that gives no representation for the Q heads.
    """
    with torch.no_grad():
        output = policy(**policy_inputs(runner.observations().select([0])))
    if output.features is None:
        raise SetupError(
            f"{type(policy).__name__} gives no state representation (PolicyOutput.features) "
            "for SAC's Q heads"
        )
    return int(output.features.shape[-1])


def _features(critics: TwinCritic) -> int:
    return int(critics.q1[0].in_features)


def _heads_state(agent: SacAgent, target: TwinCritic) -> dict[str, Tensor]:
    state = {f"critics.{k}": v for k, v in agent.critics.state_dict().items()}
    state |= {f"target.{k}": v for k, v in target.state_dict().items()}
    state["log_alpha"] = agent.log_alpha.detach().reshape(1)
    return {name: value.detach().cpu().contiguous() for name, value in state.items()}


def _load_sac_state(
    accelerator: Accelerator, checkpoint: Path, agent: SacAgent, target: TwinCritic, features: int
) -> int:
    """Restore the Q heads, their targets and log(alpha); return the gradient step count. A
    missing or malformed file stops every process with a message (collective)."""
    problem, gradient_steps = None, 0
    try:
        for name in (HEADS_FILE, STATE_FILE):
            if not (checkpoint / name).is_file():
                raise ValueError(f"{name} is missing: not a checkpoint of a SAC run")
        saved = json.loads((checkpoint / STATE_FILE).read_text())
        if saved["features"] != features:
            raise ValueError(
                f"its Q heads read {saved['features']} features, this policy gives {features}"
            )
        heads = load_file(checkpoint / HEADS_FILE)
        agent.critics.load_state_dict(_prefixed(heads, "critics."))
        target.load_state_dict(_prefixed(heads, "target."))
        with torch.no_grad():
            agent.log_alpha.copy_(heads["log_alpha"][0])
        gradient_steps = int(saved["gradient_steps"])
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, SafetensorError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        problem = f"cannot resume from {checkpoint}: {lines[0]}"
    raise_on_any(accelerator, problem)
    return gradient_steps


def _load_replay(accelerator: Accelerator, checkpoint: Path, replay: ReplayBuffer) -> ReplayBuffer:
    """This process's replay buffer from the checkpoint (collective on a problem)."""
    problem, loaded = None, replay
    folder = checkpoint / f"rank_{accelerator.process_index}" / REPLAY_DIR
    try:
        loaded = ReplayBuffer.load(folder, replay.capacity, replay.num_envs)
    except ReplayError as error:
        problem = f"cannot resume from {checkpoint}: {error}"
    raise_on_any(accelerator, problem)
    return loaded


def _prefixed(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _check_sac_layout(cfg: SacRunConfig, accelerator: Accelerator) -> None:
    world = accelerator.num_processes
    try:  # a config changed after its checks (a test's, a script's)
        cfg.check_sections()
    except ValueError as error:
        raise SetupError(str(error)) from None
    if cfg.algorithm.name != "sac":
        raise SetupError(f"algorithm.name={cfg.algorithm.name!r}: train_sac trains sac")
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise SetupError(
            "algorithm.name=sac trains in one process or with DDP (configs/accelerate/"
            "multi_cpu.yaml, multi_gpu.yaml), not under DeepSpeed"
        )
    if cfg.train.save_rollouts:
        raise SetupError("train.save_rollouts=true saves a PPO run's decisions; SAC runs do not")
    if world > MAX_PROCESSES:
        raise SetupError(f"{world} processes: at most {MAX_PROCESSES} per run")
    for name, value in (("env.num_envs", cfg.env.num_envs), ("sac.batch_size", cfg.sac.batch_size)):
        if value % world:
            raise SetupError(
                f"{name}={value} is not divisible by the {world} processes: each process takes "
                "an equal share; pick a multiple of the process count"
            )
