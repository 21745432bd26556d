"""Word ids for the agents that read text from scratch (no tokenizer, no vocabulary file).

A word's id is its crc32 hash modulo the number of embedding rows: stable across processes and
Python runs (unlike `hash`), nothing to save beside the weights, and paraphrased or translated
text still encodes. Id 0 is padding; words take ids 1 .. buckets - 1.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Sequence

import torch

WORD = re.compile(r"[^\W_]+|[^\w\s]", re.UNICODE)
"""A run of letters or digits, or one punctuation mark."""


def split_words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of `text`."""
    return WORD.findall(text.lower())


def word_id(word: str, buckets: int) -> int:
    """The embedding row of `word` (1 .. buckets - 1)."""
    return 1 + zlib.crc32(word.encode("utf-8")) % (buckets - 1)


@functools.lru_cache(maxsize=1 << 16)
def text_word_ids(text: str, buckets: int) -> tuple[int, ...]:
    """The embedding rows of the words of `text` (cached: agents read the same prompts, mission
    and action strings over and over, and a replay buffer replays them)."""
    return tuple(word_id(word, buckets) for word in split_words(text))


def encode_texts(
    texts: Sequence[str], buckets: int, *, max_words: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Word ids of each text, padded with 0.

    Returns:
        `(ids, lengths)`: `(B, L)` long ids and `(B,)` word counts (at least 1: an empty text is
        one padding word, so that a GRU always has a step to run). `max_words` keeps the last
        `max_words` words of a longer text (the newest observation ends a prompt).
    """
    rows = []
    for text in texts:
        ids = list(text_word_ids(text, buckets))
        if max_words is not None:
            ids = ids[-max_words:]
        rows.append(ids or [0])
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    width = int(lengths.max()) if rows else 0
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows], dtype=torch.long)
    return ids.reshape(len(rows), width), lengths
