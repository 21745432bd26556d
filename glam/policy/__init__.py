"""The language-model policy: prompts, heads, adapters and the actor-critics around them (one
that scores the actions, `llm_policy`; one that writes its action, `writer`).

The names below load on first use (PEP 562): a module of this package (`glam.policy.files`,
`glam.policy.prompts`) imports without peft and transformers, which take seconds to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from glam.lazy import lazy_names

if TYPE_CHECKING:
    from glam.policy.heads import ActionHeads, ValueHead
    from glam.policy.llm_policy import CheckpointError, LLMActorCritic
    from glam.policy.output import PolicyOutput
    from glam.policy.prompts import PromptHistory, build_prompt, chat_prompt, glam_prompt
    from glam.policy.writer import WritingActorCritic

_LAZY_NAMES = {
    "ActionHeads": "glam.policy.heads",
    "ValueHead": "glam.policy.heads",
    "CheckpointError": "glam.policy.llm_policy",
    "LLMActorCritic": "glam.policy.llm_policy",
    "PolicyOutput": "glam.policy.output",
    "PromptHistory": "glam.policy.prompts",
    "build_prompt": "glam.policy.prompts",
    "chat_prompt": "glam.policy.prompts",
    "glam_prompt": "glam.policy.prompts",
    "WritingActorCritic": "glam.policy.writer",
}
"""Name -> the module that defines it."""

__all__ = [
    "ActionHeads",
    "CheckpointError",
    "LLMActorCritic",
    "PolicyOutput",
    "PromptHistory",
    "ValueHead",
    "WritingActorCritic",
    "build_prompt",
    "chat_prompt",
    "glam_prompt",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY_NAMES, __all__)
