"""Instruction encoding by hashing: words and word bigrams -> ``crc32 % buckets`` -> EmbeddingBag.

Why hashing and not a tokenizer: the embedded policy must build and serve offline with nothing to
download (``HF_HUB_OFFLINE=1``), and a handful of task instructions needs no subword vocabulary.
``zlib.crc32`` is stable across processes and Python versions (unlike ``hash()``, which is salted
per process), so a checkpoint's embedding rows mean the same words wherever it is loaded. Bigrams
keep some word order ("cube to goal" vs "goal to cube"). Bucket 0 is reserved for an empty prompt
so every sample has at least one token.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from functools import lru_cache

import torch

__all__ = ["encode_prompts", "prompt_buckets", "tokenize"]

_WORD = re.compile(r"[a-z0-9]+")


def tokenize(prompt: str) -> list[str]:
    """Lower-case alphanumeric words: ``"Put the RED cube!"`` -> ``["put", "the", "red", "cube"]``."""
    return _WORD.findall(prompt.lower())


@lru_cache(maxsize=4096)
def prompt_buckets(prompt: str, num_buckets: int) -> tuple[int, ...]:
    """Bucket ids of the words and bigrams of ``prompt`` (in 1..num_buckets-1; ``(0,)`` when empty)."""
    if num_buckets < 2:
        raise ValueError(f"num_buckets must be at least 2, got {num_buckets}")
    words = tokenize(prompt)
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
    if not grams:
        return (0,)
    return tuple(1 + zlib.crc32(g.encode("utf-8")) % (num_buckets - 1) for g in grams)


def encode_prompts(prompts: Sequence[str], num_buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, offsets)`` for ``nn.EmbeddingBag``: flat int64 bucket ids and each prompt's start index."""
    ids: list[int] = []
    offsets: list[int] = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompt[{i}]: expected a string, got {type(prompt).__name__}")
        offsets.append(len(ids))
        ids.extend(prompt_buckets(prompt, num_buckets))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long)
