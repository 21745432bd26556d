"""glam: grounding language models in BabyAI-Text with online reinforcement learning.

The names below load on first use (PEP 562): `import glam.config` or `import glam.campaign`
stays free of torch and transformers, which take seconds to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glam.models.loading import DEFAULT_MODEL, EMBEDDED_MODELS, ModelNotFoundError, load_model

__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "ModelNotFoundError", "load_model"]
__version__ = "0.1.0"

_LAZY_NAMES = {name: "glam.models.loading" for name in __all__}
"""Top-level name -> the module that defines it."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
