"""The Deep Reinforcement Relevance Network (He et al. 2016): a text agent learnt from scratch.

Q(s, a) for a prompt s and a candidate action string a: each text is read word by word (hashed
word ids, `glam.baselines.words`) by a GRU of its own, one for prompts and one for actions,
sharing the word embedding; an MLP on the two final hidden states `[h_s; h_a]` gives the Q value.

`DRRNPolicy.forward(prompts, candidates)` answers like the language-model policy
(`glam.policy.llm_policy.PolicyOutput`): the logits are the Q values (-inf where a ragged
candidate list has no entry) and the value is max_a Q(s, a), so whatever plays a text policy
through `policy(prompts, candidates)` plays DRRN too, greedily on Q with an argmax. Training:
`glam.baselines.drrn_trainer`.

A saved policy is a folder of two files, `glam_policy.json` (`"kind": "drrn"`, the network's
sizes, the action words and the training env) and `model.safetensors`; loading runs no code from
it, and a missing, truncated or malformed file is a `CheckpointError` that names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glam.baselines.config import DRRNConfig
from glam.baselines.words import encode_texts
from glam.config import EnvConfig
from glam.policy.files import (
    CONFIG_FILE,
    CheckpointError,
    check_words_and_env,
    env_record,
    load_weights,
    read_policy_config,
    save_policy_folder,
)
from glam.policy.output import PolicyOutput

KIND = "drrn"
NETWORK_FIELDS = ("embedding_dim", "hidden_dim", "vocabulary_buckets")
"""The `DRRNConfig` fields that shape the network (saved with the weights)."""


class DRRNPolicy(nn.Module):
    """Q values of text actions given a text prompt (He et al.'s DRRN).

    Attributes:
        action_words: the env's actions, in order (the candidates a runner offers).
        training_env: the settings of the env the policy was trained on (`EnvConfig`'s fields,
            recorded by `save_pretrained`), when known.
    """

    def __init__(
        self,
        action_words: Sequence[str],
        *,
        embedding_dim: int,
        hidden_dim: int,
        vocabulary_buckets: int,
    ) -> None:
        super().__init__()
        self.action_words = list(action_words)
        self.training_env: dict[str, Any] | None = None
        self.network = {
            "embedding_dim": embedding_dim,
            "hidden_dim": hidden_dim,
            "vocabulary_buckets": vocabulary_buckets,
        }
        """The sizes the network was built with (`NETWORK_FIELDS`)."""
        self.buckets = vocabulary_buckets
        self.embedding = nn.Embedding(vocabulary_buckets, embedding_dim, padding_idx=0)
        self.state_gru = nn.GRU(embedding_dim, hidden_dim, batch_first=True)
        self.action_gru = nn.GRU(embedding_dim, hidden_dim, batch_first=True)
        self.q_head = nn.Sequential(
            nn.Linear(2 * hidden_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1)
        )

    @classmethod
    def from_config(
        cls,
        cfg: DRRNConfig,
        action_words: Sequence[str],
        *,
        training_env: EnvConfig | Mapping[str, Any] | None = None,
    ) -> DRRNPolicy:
        """A freshly initialised network of the sizes `cfg` gives (torch's RNG draws it)."""
        policy = cls(action_words, **{name: getattr(cfg, name) for name in NETWORK_FIELDS})
        policy.training_env = env_record(training_env)
        return policy

    def forward(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]] | None = None
    ) -> PolicyOutput:
        """Q values of every prompt's candidates.

        `candidates[i]` are the action strings available after `prompts[i]` (ragged lists
        allowed); None offers `action_words` to every prompt. Each distinct text of the batch is
        encoded once.

        Returns:
            `PolicyOutput` with logits `(B, C_max)` = Q(s, a) (-inf where absent), values `(B,)`
            = max_a Q(s, a), and the mask of the candidates that exist.
        """
        if candidates is None:
            candidates = [self.action_words] * len(prompts)
        if len(prompts) != len(candidates):
            raise ValueError(
                f"prompts and candidates have different lengths ({len(prompts)} prompts, "
                f"{len(candidates)} candidate lists): give one list of candidates per prompt"
            )
        if not prompts:
            raise ValueError("no prompts: the batch is empty")
        empty = [i for i, actions in enumerate(candidates) if not actions]
        if empty:
            raise ValueError(f"candidates[{empty[0]}] is empty: every prompt needs an action")
        device = self.q_head[0].weight.device
        state_codes = self._encode_prompts(prompts, device)  # (B, H)
        action_codes, index, mask = self._encode_candidates(candidates, device)
        # (B, C, H) pairs: each prompt's code next to the code of each of its candidates.
        pairs = torch.cat(
            [state_codes[:, None, :].expand(-1, index.shape[1], -1), action_codes[index]], dim=-1
        )
        q_values = self.q_head(pairs).squeeze(-1).masked_fill(~mask, float("-inf"))
        return PolicyOutput(logits=q_values, values=q_values.max(dim=-1).values, mask=mask)

    def _read(self, gru: nn.GRU, texts: Sequence[str], device: torch.device) -> Tensor:
        """`(N, H)` codes of `texts`: the last hidden state of `gru` over each one's words."""
        ids, lengths = encode_texts(texts, self.buckets)
        # Padded, not packed: the GRU reads left to right, so its output at a text's last word
        # ignores the padding after it, and the padded kernels run ~4x faster backward on a CPU.
        outputs, _ = gru(self.embedding(ids.to(device)))  # (N, L, H)
        last = (lengths - 1).to(device)
        return outputs[torch.arange(len(texts), device=device), last]

    def _encode_prompts(self, prompts: Sequence[str], device: torch.device) -> Tensor:
        """`(B, H)` codes of the prompts, each distinct prompt read once."""
        unique = list(dict.fromkeys(prompts))
        position = {prompt: k for k, prompt in enumerate(unique)}
        codes = self._read(self.state_gru, unique, device)
        return codes[torch.tensor([position[prompt] for prompt in prompts], device=device)]

    def _encode_candidates(
        self, candidates: Sequence[Sequence[str]], device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Codes of the distinct action strings `(U, H)`, and per prompt the index of each of its
        candidates among them `(B, C_max)` (0 where absent) with the mask of those present."""
        unique = list(dict.fromkeys(action for actions in candidates for action in actions))
        position = {action: k for k, action in enumerate(unique)}
        width = max(len(actions) for actions in candidates)
        rows = [
            [position[a] for a in actions] + [0] * (width - len(actions)) for actions in candidates
        ]
        index = torch.tensor(rows, dtype=torch.long, device=device)
        counts = torch.tensor([len(actions) for actions in candidates], device=device)
        mask = torch.arange(width, device=device)[None, :] < counts[:, None]
        return self._read(self.action_gru, unique, device), index, mask

    # ----------------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------------

    def save_pretrained(
        self, path: str | Path, *, training_env: EnvConfig | Mapping[str, Any] | None = None
    ) -> Path:
        """Write `glam_policy.json` and `model.safetensors` into the folder `path`.

        `training_env` (by default `self.training_env`) is recorded, so that a policy folder
        copied on its own is still evaluated on its prompt length and actions.
        """
        meta = {
            "kind": KIND,
            "network": dict(self.network),
            "action_words": self.action_words,
            "env": env_record(training_env) or self.training_env,
        }
        return save_policy_folder(path, self, meta)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, training_env: EnvConfig | Mapping[str, Any] | None = None
    ) -> DRRNPolicy:
        """Restore a policy written by `save_pretrained`; `training_env` replaces the recorded one.

        Raises:
            CheckpointError: a file of the folder is missing, truncated or malformed, or the
                folder holds another kind of policy (the message names the file).
        """
        path = Path(path)
        meta = _read_meta(path)
        policy = cls(meta["action_words"], **meta["network"])
        policy.training_env = env_record(training_env) or meta.get("env")
        load_weights(policy, path, "network sizes")
        return policy


def _read_meta(path: Path) -> dict[str, Any]:
    """`glam_policy.json` of the DRRN policy folder `path`, checked for the keys and types
    loading relies on."""
    meta, file = read_policy_config(path), path / CONFIG_FILE
    kind = meta.get("kind", "llm")
    if kind != KIND:
        raise CheckpointError(f"{file}: a {kind!r} policy, not a DRRN one")
    network = meta.get("network")
    if not isinstance(network, dict) or sorted(network) != sorted(NETWORK_FIELDS):
        raise CheckpointError(
            f"{file}: 'network' must hold {list(NETWORK_FIELDS)}, got {network!r}"
        )
    if not all(type(value) is int and value > 0 for value in network.values()):
        raise CheckpointError(f"{file}: 'network' sizes must be positive integers ({network!r})")
    if network["vocabulary_buckets"] < 2:
        raise CheckpointError(f"{file}: vocabulary_buckets must be >= 2 ({network!r})")
    check_words_and_env(file, meta)
    return meta
