"""Online PPO for language-model policies: rollout storage, GAE, losses, the trainer.

The names below load on first use (PEP 562): the algorithm's config section
(`glam.ppo.algorithm_config`), which the training run's schema imports, stays free of torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from glam.lazy import lazy_names

if TYPE_CHECKING:
    from glam.ppo.gae import compute_gae
    from glam.ppo.losses import explained_variance, normalize_advantages, ppo_loss

__all__ = ["compute_gae", "explained_variance", "normalize_advantages", "ppo_loss"]

_LAZY_NAMES = {
    "compute_gae": "glam.ppo.gae",
    "explained_variance": "glam.ppo.losses",
    "normalize_advantages": "glam.ppo.losses",
    "ppo_loss": "glam.ppo.losses",
}
"""Name -> the module that defines it."""


__getattr__, __dir__ = lazy_names(__name__, _LAZY_NAMES, __all__)
