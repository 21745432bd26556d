"""glam: grounding language models in BabyAI-Text with online reinforcement learning."""

from __future__ import annotations

from glam.models.loading import DEFAULT_MODEL, EMBEDDED_MODELS, ModelNotFoundError, load_model

__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "ModelNotFoundError", "load_model"]
__version__ = "0.1.0"
