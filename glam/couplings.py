"""The trainer hooks and policy factory a training run's config asks for: the one place that
knows the couplings' names (the trainer does not; the training scripts ask here)."""

from __future__ import annotations

from collections.abc import Sequence

from glam.ask.hook import AskHook, build_mediator_policy
from glam.codeact.hook import CodeactHook
from glam.oni.hook import OniHook
from glam.ppo.hooks import TrainerHook
from glam.ppo.setup import PolicyFactory
from glam.probe import ProbeHook
from glam.run_config import TrainingRunConfig
from glam.teach.hook import TeachHook


def coupling_hooks(cfg: TrainingRunConfig) -> list[TrainerHook]:
    """The hooks of `cfg`'s couplings and diagnostics, in the order the trainer calls them."""
    hooks: list[TrainerHook] = []
    if cfg.train.probe_every:
        hooks.append(ProbeHook())
    if cfg.teach.teacher != "none":
        hooks.append(TeachHook(cfg.teach))
    if cfg.ask.mode != "none":
        hooks.append(AskHook(cfg.ask))
    if cfg.codeact.chooser != "none":
        hooks.append(CodeactHook(cfg.codeact, cfg))
    if cfg.oni.reward_model != "none":  # after codeact: it rewards a coded action's events
        hooks.append(OniHook(cfg.oni, seed=cfg.train.seed))
    return hooks


def coupling_policy_factory(
    cfg: TrainingRunConfig, default: PolicyFactory, hooks: Sequence[TrainerHook] = ()
) -> PolicyFactory:
    """The run's policy factory: a coupling that changes the env's actions builds its policy
    over them (LLM4RL's mediator over ask / continue; `default`'s network over the primitive
    and coded actions of the run's `CodeactHook`, among `hooks`); otherwise `default`."""
    if cfg.ask.mode != "none":
        return build_mediator_policy
    for hook in hooks:
        if isinstance(hook, CodeactHook):
            return hook.policy_factory(default)
    return default
