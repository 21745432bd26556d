"""Online PPO for language-model policies: rollout storage, GAE, losses, the trainer."""

from __future__ import annotations

from glam.ppo.gae import compute_gae
from glam.ppo.losses import explained_variance, normalize_advantages, ppo_loss

__all__ = ["compute_gae", "explained_variance", "normalize_advantages", "ppo_loss"]
