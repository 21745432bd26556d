"""What any policy of the trainer says about a batch of observations: `PolicyOutput`.

Its own module (torch only) so that the small policies (`glam.baselines`) and the evaluation
harness import it without the language-model stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributions import Categorical

from glam.trunk import TrunkStates


@dataclass
class PolicyOutput:
    """What the policy says about a batch of prompts."""

    logits: Tensor
    """(B, C_max) unnormalised log-probabilities of the candidates; -inf where absent."""
    values: Tensor
    """(B,) state values."""
    mask: Tensor
    """(B, C_max) True where a candidate exists."""
    memory: Tensor | None = None
    """(B, memory_size) a policy with memory's memory after this step, to pass to its next
    step (`glam.baselines.symbolic`); None for a policy without memory."""
    trunk: list[TrunkStates] | None = None
    """Per prompt, what a language model's frozen trunk computed (`glam.trunk`), for the update
    to run from; None unless the policy keeps them (`LLMActorCritic.enable_trunk_cache`)."""
    features: Tensor | None = None
    """`(B, F)` the state representation the value head reads (a language model's last prompt
    token, the symbolic network's embedding), for heads outside the policy (SAC's Q heads,
    `glam.offpolicy`); None for a policy that gives none."""

    @property
    def dist(self) -> Categorical:
        """The action distribution over each prompt's candidates.

        Unvalidated: torch's checks of the logits and of each sampled action read values back
        from the device, a wait for the GPU at every rollout step and micro-batch; the trainer
        checks that the logits are finite (`glam.ppo.update.finite_output`) before it samples or
        takes a loss."""
        return Categorical(logits=self.logits, validate_args=False)

    def rows(self, n: int) -> PolicyOutput:
        """The output of the first `n` prompts of the batch."""
        memory = None if self.memory is None else self.memory[:n]
        trunk = None if self.trunk is None else self.trunk[:n]
        features = None if self.features is None else self.features[:n]
        return PolicyOutput(
            self.logits[:n], self.values[:n], self.mask[:n], memory, trunk, features
        )

    @classmethod
    def cat(cls, parts: Sequence[PolicyOutput]) -> PolicyOutput:
        """The outputs one after the other (the same number of candidates in each)."""
        memories = [part.memory for part in parts]
        trunks = [part.trunk for part in parts]
        features = [part.features for part in parts]
        return cls(
            torch.cat([part.logits for part in parts]),
            torch.cat([part.values for part in parts]),
            torch.cat([part.mask for part in parts]),
            None if any(m is None for m in memories) else torch.cat(memories),
            None if any(t is None for t in trunks) else [s for t in trunks for s in t],
            None if any(f is None for f in features) else torch.cat(features),
        )
