"""glam: grounding language models in BabyAI-Text with online reinforcement learning.

The names below load on first use (PEP 562): `import glam.config` or `import glam.campaign`
stays free of torch and transformers, which take seconds to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from glam.lazy import lazy_names

if TYPE_CHECKING:
    from glam.models.loading import DEFAULT_MODEL, EMBEDDED_MODELS, ModelNotFoundError, load_model

__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "ModelNotFoundError", "load_model"]
__version__ = "0.1.0"

_LAZY_NAMES = {name: "glam.models.loading" for name in __all__}
"""Top-level name -> the module that defines it."""


__getattr__, __dir__ = lazy_names(__name__, _LAZY_NAMES, __all__)
