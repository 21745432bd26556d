"""The language-model policy: prompts, heads, adapters and the actor-critic around them."""

from __future__ import annotations

from glam.policy.heads import ActionHeads, ValueHead
from glam.policy.llm_policy import CheckpointError, LLMActorCritic, PolicyOutput
from glam.policy.prompts import PromptHistory, build_prompt, chat_prompt, glam_prompt

__all__ = [
    "ActionHeads",
    "CheckpointError",
    "LLMActorCritic",
    "PolicyOutput",
    "PromptHistory",
    "ValueHead",
    "build_prompt",
    "chat_prompt",
    "glam_prompt",
]
