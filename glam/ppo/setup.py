"""A PPO run's set-up: from the config to everything the loop works with (`Training`).

`build_training` checks the processes' layout and the run folder, picks the checkpoint to resume
(before any model is loaded), builds the envs (each as the hooks wrap it), the policy
(`PolicyFactory`: the language model's by default, `build_policy`), the algorithm, the optimizer
and its schedule, restores the checkpoint and opens the logs. `Training.save` writes a
checkpoint. `build_run_policy` and `open_logs` serve the off-policy learners too.
"""

from __future__ import annotations

import math
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
from glam.config import LANGUAGE_MODEL_KINDS, CoreRunConfig, PPOConfig, check_recurrence
from glam.demos import write_demos
from glam.envs import MAX_PROCESSES, EnvRunner, env_seed, resolve_action_space
from glam.models.loading import ModelNotFoundError, prepare_model_cache
from glam.models.precision import resolve_autocast_bf16
from glam.policy.llm_policy import CheckpointError, LLMActorCritic
from glam.policy.writer import WritingActorCritic
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.algorithms import PPO, Algorithm, build_algorithm
from glam.ppo.buffer import RolloutBuffer
from glam.ppo.hooks import TrainerHook
from glam.ppo.learner import LearnerTraining
from glam.ppo.logger import MetricsLogger, ProgressBar
from glam.ppo.run_config import PPORunConfig
from glam.ppo.timing import PhaseClock
from glam.ppo.update import accumulation_steps, micro_batch_size
from glam.ppo.written import WrittenEnvRunner
from glam.runs.checkpoint import TrainerState
from glam.runs.errors import SetupError
from glam.runs.lifecycle import (
    announce_resume,
    open_run_dir,
    resolved_config_yaml,
    restore_training_state,
)

__all__ = [
    "PolicyFactory",
    "Training",
    "build_policy",
    "build_training",
    "lr_factor",
    "open_logs",
    "resolve_trunk_cache",
]


@dataclass(kw_only=True)
class Training(LearnerTraining[PPORunConfig]):
    """Everything the loop works with, built by `build_training`: every learner's state
    (`LearnerTraining`) and PPO's own."""

    buffer: RolloutBuffer
    recompute: bool
    """Recompute old log-probs in the update (reduced precision makes them drift)."""
    cache_trunk: bool
    """The rollout keeps the frozen trunk's states and the update runs from them
    (`ppo.cache_trunk`, resolved)."""
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
        written = self.saved
        checkpoint = super().save()
        if self.saved is not written and self.runner.recording:
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


def build_training(
    cfg: PPORunConfig,
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
    # Collective under ZeRO-3 (partitioned at init).
    policy = build_run_policy(cfg, accelerator, make_policy, resume_from)
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

    groups = parameter_groups(policy, cfg.ppo, algorithm)
    optimizer = torch.optim.AdamW(
        groups,
        lr=cfg.ppo.lr,
        betas=tuple(cfg.ppo.adam_betas),
        eps=cfg.ppo.adam_eps,
        weight_decay=cfg.ppo.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, group_lr_factors(groups, cfg.ppo, cfg.num_updates)
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
        scheduler.lr_lambdas = group_lr_factors(groups, cfg.ppo, num_updates)
        scheduler.base_lrs = [group["base_lr"] for group in groups]
        for group, base, factor in zip(
            optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
        ):
            group["lr"], group["base_lr"] = base * factor(state.update), base
    config_yaml, logger, progress = open_logs(
        cfg, accelerator, run_dir, resume_from, state, num_updates, cfg.frames_per_update
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


def build_run_policy(
    cfg: CoreRunConfig,
    accelerator: Accelerator,
    make_policy: Callable[[Any, Path | None], torch.nn.Module],
    resume_from: Path | None,
) -> torch.nn.Module:
    """Every learner's policy: `make_policy(cfg, resume_from)`, a policy file the checks could
    not judge (its content) refused, and a warm start's source said (`train.init_policy`).

    Raises:
        SetupError: the checkpoint's policy cannot be loaded.
    """
    try:
        policy = make_policy(cfg, resume_from)
    except CheckpointError as error:
        raise SetupError(f"cannot resume from {resume_from}: {error}") from None
    if cfg.train.init_policy and resume_from is None:
        accelerator.print(
            f"[glam] policy weights from {cfg.train.init_policy} (the critic starts untrained)"
        )
    return policy


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
    cfg: PPORunConfig,
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


def _note_episode_limit(cfg: PPORunConfig, accelerator: Accelerator) -> None:
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
    cfg: PPORunConfig, algorithm: Algorithm, policy: torch.nn.Module, world: int
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
    cfg: PPORunConfig, policy: torch.nn.Module, accelerator: Accelerator
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


PolicyFactory = Callable[[PPORunConfig, "Path | None"], torch.nn.Module]
"""Builds the actor-critic of a run: `(cfg, checkpoint)` -> module, restored from
`checkpoint / "policy"` when resuming. The module maps a batch of observations
(`observation_kind`: `text`, the default, or `grid`; passed as `model(**observations.inputs())`)
to a `PolicyOutput` over its `action_words`, has `save_pretrained(folder)`, and raises
`SetupError` or `CheckpointError` when it cannot be built. A module with a `memory_size` above 0
has memory: it is also passed `memory=` `(batch, memory_size)` and returns the next in
`PolicyOutput.memory` (the module docstring says how it is trained)."""


def build_policy(cfg: PPORunConfig, checkpoint: Path | None) -> torch.nn.Module:
    """The language-model actor-critic of the config; with a checkpoint, its trained adapter
    and heads; otherwise, with `train.init_policy`, a saved policy's acting weights (the
    default `PolicyFactory`)."""
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
        policy = LLMActorCritic.from_config(
            cfg.model, cfg.policy, action_words, training_env=cfg.env
        )
    except ModelNotFoundError as error:
        raise SetupError(f"model.name_or_path={cfg.model.name_or_path!r}: {error}") from None
    except CheckpointError as error:
        raise SetupError(f"cannot resume: {error}") from None
    # A writing policy on an encoder-decoder model, a warm start's adapter of another shape
    # or missing (`model.lora.init`)...
    except (ValueError, FileNotFoundError) as error:
        raise SetupError(str(error)) from None
    if cfg.train.init_policy:
        try:
            policy.start_from(cfg.train.init_policy, trust_remote_code=cfg.model.trust_remote_code)
        except (CheckpointError, ModelNotFoundError, ValueError) as error:
            raise SetupError(f"train.init_policy: {error}") from None
    return policy


VALUE_MODULES = ("value_head", "critic")
"""The attribute that holds a policy's critic: the language model's value head, the symbolic
network's critic."""


def parameter_groups(policy: torch.nn.Module, ppo: PPOConfig, algorithm: Algorithm) -> list[dict]:
    """The optimizer's parameter groups: one of every trainable parameter at `ppo.lr`, or, when
    `ppo.value_lr` or `ppo.value_warmup_updates` is set, the policy's and the critic's apart
    (the critic's at `ppo.value_lr`). Each group says its `role` and `base_lr`.

    Raises:
        SetupError: a critic setting where the algorithm learns no value or the policy has no
            critic.
    """
    trainable = [p for p in policy.parameters() if p.requires_grad]
    if ppo.value_lr is None and not ppo.value_warmup_updates:
        return [{"params": trainable, "lr": ppo.lr, "base_lr": ppo.lr, "role": "all"}]
    critic = next((getattr(policy, name) for name in VALUE_MODULES if hasattr(policy, name)), None)
    if not algorithm.uses_value or critic is None:
        whose = f"algorithm.name={algorithm.name}" if critic is not None else type(policy).__name__
        raise SetupError(
            f"ppo.value_lr and ppo.value_warmup_updates set the critic's learning, but "
            f"{whose} has no critic"
        )
    in_critic = {id(p) for p in critic.parameters()}
    value_lr = ppo.lr if ppo.value_lr is None else ppo.value_lr
    return [
        {
            "params": [p for p in trainable if id(p) not in in_critic],
            "lr": ppo.lr,
            "base_lr": ppo.lr,
            "role": "policy",
        },
        {
            "params": [p for p in trainable if id(p) in in_critic],
            "lr": value_lr,
            "base_lr": value_lr,
            "role": "value",
        },
    ]


def group_lr_factors(
    groups: Sequence[dict], ppo: PPOConfig, num_updates: int
) -> list[Callable[[int], float]]:
    """Each group's learning-rate multiplier by update (`lr_factor`); the policy's is 0 during
    the critic's warm-up (`ppo.value_warmup_updates`)."""

    def scheduled(update: int) -> float:
        return lr_factor(update, ppo, num_updates)

    def after_value_warmup(update: int) -> float:
        return 0.0 if update < ppo.value_warmup_updates else scheduled(update)

    return [after_value_warmup if g["role"] == "policy" else scheduled for g in groups]


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
    cfg: CoreRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    resume_from: Path | None,
    state: TrainerState,
    num_updates: int,
    frames_per_update: int,
    *,
    title: str = "PPO",
) -> tuple[str, MetricsLogger, ProgressBar]:
    """Every learner's opening of its run: say where a resumed run goes on from, write
    `config.yaml` (`resolved_config_yaml`), open the metrics logs and a progress bar up to the
    run's last update (their output on the main process only), and say when the last update
    overshoots `train.total_frames`. Returns `(config_yaml, logger, progress)`.

    `config.yaml` is this session's config, a resumed one's too: the settings a resume changed
    (`glam.runs.lifecycle.changed_settings`) are the run's from now on; each checkpoint keeps the
    config that wrote it. With `train.resume=true` the logs rewind to the checkpoint's update (to
    0 if none was found).
    """
    announce_resume(cfg, accelerator, run_dir, resume_from, state)
    config_yaml = resolved_config_yaml(cfg, accelerator, num_updates, frames_per_update)
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
    return config_yaml, logger, progress


def _check_layout(cfg: PPORunConfig, world: int) -> None:
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


def _configure_deepspeed(accelerator: Accelerator, cfg: PPORunConfig) -> None:
    """Give DeepSpeed the batch layout it otherwise reads from a dataloader (we have none)."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    world = accelerator.num_processes
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    ds_config["train_micro_batch_size_per_gpu"] = micro_batch_size(cfg.ppo, world)
    ds_config["gradient_accumulation_steps"] = accumulation_steps(cfg.ppo, world)
    ds_config["train_batch_size"] = cfg.ppo.minibatch_size
    ds_config["gradient_clipping"] = cfg.ppo.max_grad_norm
