"""The replay buffer of DRRN: the last transitions of one process's envs, text and all.

Transitions keep their prompts and candidate strings (the network reads text). A checkpoint
stores a buffer pickle-free, oldest transition first: `replay.json` holds each distinct prompt
and candidate list once, `replay.safetensors` per transition the indices into them, the action,
the reward and whether the episode terminated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

REPLAY_JSON = "replay.json"
REPLAY_TENSORS = "replay.safetensors"


@dataclass
class ReplayBatch:
    """Transitions drawn from the replay buffer."""

    prompts: list[str]
    candidates: list[list[str]]
    actions: torch.Tensor
    """`(B,)` long: index of the action taken among the candidates."""
    rewards: torch.Tensor
    """`(B,)` float: the (scaled) reward of the step."""
    next_prompts: list[str]
    """The prompt after the step; for a time-out, that of the final observation."""
    next_candidates: list[list[str]]
    terminals: torch.Tensor
    """`(B,)` bool: the episode terminated (success or failure), not a time-out."""

    def __len__(self) -> int:
        return len(self.prompts)

    def join(self, other: ReplayBatch) -> ReplayBatch:
        """This batch's transitions, then `other`'s."""
        return ReplayBatch(
            prompts=self.prompts + other.prompts,
            candidates=self.candidates + other.candidates,
            actions=torch.cat([self.actions, other.actions]),
            rewards=torch.cat([self.rewards, other.rewards]),
            next_prompts=self.next_prompts + other.next_prompts,
            next_candidates=self.next_candidates + other.next_candidates,
            terminals=torch.cat([self.terminals, other.terminals]),
        )


class ReplayBuffer:
    """The last `capacity` transitions of one process's envs, in a ring."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.prompts: list[str] = [""] * capacity
        self.candidates: list[list[str]] = [[] for _ in range(capacity)]
        self.next_prompts: list[str] = [""] * capacity
        self.next_candidates: list[list[str]] = [[] for _ in range(capacity)]
        self.actions = torch.zeros(capacity, dtype=torch.long)
        self.rewards = torch.zeros(capacity)
        self.terminals = torch.zeros(capacity, dtype=torch.bool)
        self.position = 0
        """Slot the next transition goes into (the oldest one once the buffer is full)."""
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        prompts: Sequence[str],
        candidates: Sequence[Sequence[str]],
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_prompts: Sequence[str],
        next_candidates: Sequence[Sequence[str]],
        terminals: torch.Tensor,
    ) -> None:
        """Store one transition per env (oldest ones overwritten once full)."""
        for i, prompt in enumerate(prompts):
            slot = self.position
            self.prompts[slot], self.candidates[slot] = prompt, list(candidates[i])
            self.next_prompts[slot] = next_prompts[i]
            self.next_candidates[slot] = list(next_candidates[i])
            self.actions[slot], self.rewards[slot] = actions[i], rewards[i]
            self.terminals[slot] = terminals[i]
            self.position = (slot + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> ReplayBatch:
        """`batch_size` transitions drawn uniformly with replacement (torch's global RNG)."""
        if self.size == 0:
            raise ValueError("the replay buffer is empty")
        return self.select(torch.randint(self.size, (batch_size,)).tolist())

    def select(self, slots: Sequence[int]) -> ReplayBatch:
        """The transitions in `slots`, in that order."""
        index = torch.as_tensor(slots, dtype=torch.long)
        return ReplayBatch(
            prompts=[self.prompts[k] for k in slots],
            candidates=[self.candidates[k] for k in slots],
            actions=self.actions[index],
            rewards=self.rewards[index],
            next_prompts=[self.next_prompts[k] for k in slots],
            next_candidates=[self.next_candidates[k] for k in slots],
            terminals=self.terminals[index],
        )

    def chronological_slots(self) -> list[int]:
        """The filled slots, oldest transition first."""
        if self.size < self.capacity:
            return list(range(self.size))
        return [*range(self.position, self.capacity), *range(self.position)]

    def save(self, folder: Path) -> None:
        """Write `replay.json` (the distinct texts) and `replay.safetensors` (per transition,
        indices into them and the numbers), oldest transition first. Pickle-free."""
        slots = self.chronological_slots()
        texts: dict[str, int] = {}
        lists: dict[tuple[str, ...], int] = {}

        def text_ids(values: list[str]) -> torch.Tensor:
            return torch.tensor([texts.setdefault(v, len(texts)) for v in values], dtype=torch.long)

        def list_ids(values: list[list[str]]) -> torch.Tensor:
            keys = [tuple(v) for v in values]
            return torch.tensor([lists.setdefault(k, len(lists)) for k in keys], dtype=torch.long)

        batch = self.select(slots)
        tensors = {
            "prompts": text_ids(batch.prompts),
            "next_prompts": text_ids(batch.next_prompts),
            "candidates": list_ids(batch.candidates),
            "next_candidates": list_ids(batch.next_candidates),
            "actions": batch.actions,
            "rewards": batch.rewards,
            "terminals": batch.terminals.to(torch.uint8),
        }
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / REPLAY_TENSORS)
        tables = {"size": len(slots), "texts": list(texts), "candidate_lists": list(lists)}
        (folder / REPLAY_JSON).write_text(json.dumps(tables))

    def load(self, folder: Path) -> None:
        """Replace the content by the transitions `save` wrote into `folder`, oldest first (the
        newest `capacity` of them if the capacity shrank).

        Raises:
            ValueError: a file is missing or malformed (the message names it).
        """
        for name in (REPLAY_JSON, REPLAY_TENSORS):
            if not (folder / name).is_file():
                raise ValueError(f"{folder / name} is missing")
        try:
            tables = json.loads((folder / REPLAY_JSON).read_text())
            tensors = load_file(folder / REPLAY_TENSORS)
        except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError) as error:
            raise ValueError(f"{folder}: the replay buffer is unreadable ({error})") from None
        try:
            size, texts, lists = tables["size"], tables["texts"], tables["candidate_lists"]
            columns = {key: tensors[key] for key in ("prompts", "next_prompts", "candidates")}
            columns |= {key: tensors[key] for key in ("next_candidates", "actions", "rewards")}
            columns["terminals"] = tensors["terminals"].bool()
            if any(len(column) != size for column in columns.values()):
                raise ValueError(f"columns of another length than size={size}")
            batch = ReplayBatch(
                prompts=[texts[k] for k in columns["prompts"].tolist()],
                candidates=[lists[k] for k in columns["candidates"].tolist()],
                actions=columns["actions"],
                rewards=columns["rewards"],
                next_prompts=[texts[k] for k in columns["next_prompts"].tolist()],
                next_candidates=[lists[k] for k in columns["next_candidates"].tolist()],
                terminals=columns["terminals"],
            )
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise ValueError(f"{folder / REPLAY_JSON}: malformed replay buffer ({error})") from None
        self.__init__(self.capacity)
        keep = slice(max(0, size - self.capacity), size)
        self.add(
            batch.prompts[keep],
            batch.candidates[keep],
            batch.actions[keep],
            batch.rewards[keep],
            batch.next_prompts[keep],
            batch.next_candidates[keep],
            batch.terminals[keep],
        )
