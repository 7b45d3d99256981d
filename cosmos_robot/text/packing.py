"""Best-fit-decreasing packing of token sequences, and the packed forward pass that keeps them apart.

Why packing: conversations have very different lengths; padding each row to the longest wastes
most of the compute on short tasks. Rows here are flat concatenations of whole sequences with
``position_ids`` restarting at 0 for each, and no attention mask: ``transformers`` then finds the
sequence boundaries from the position ids and masks attention across them, BUT only with
``use_cache=False``. With the default cache the masking utilities skip that detection and the
second sequence attends to the first (tests/text/test_packing.py shows both). ``packed_logits`` is
the one place the project runs a packed forward, and it always passes ``use_cache=False``.

Labels at every sequence start are ignored, so no token is trained to follow the previous
sequence's last token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PackedRow", "collate_rows", "pack_bfd", "packed_logits", "token_log_probs"]

IGNORE = -100


@dataclass
class PackedRow:
    """One row: sequences laid end to end (their indices in the dataset, in order)."""

    members: list[int]
    length: int


def pack_bfd(lengths: Sequence[int], capacity: int) -> list[PackedRow]:
    """Best-fit decreasing: longest first, each into the open row with the least room that still fits.

    Deterministic (ties go to the lower index); every length must be <= ``capacity`` (truncate first).
    """
    if capacity <= 0:
        raise ValueError(f"packing capacity must be positive, got {capacity}")
    too_long = [i for i, n in enumerate(lengths) if n > capacity]
    if too_long:
        raise ValueError(
            f"sequences {too_long[:5]} are longer than the packing capacity {capacity}; truncate them first"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[PackedRow] = []
    # open rows kept sorted by remaining room: (room, row index)
    rooms: list[tuple[int, int]] = []
    for i in order:
        n = lengths[i]
        if n == 0:
            continue
        k = bisect.bisect_left(rooms, (n, -1))
        if k < len(rooms):
            room, r = rooms.pop(k)
            rows[r].members.append(i)
            rows[r].length += n
            bisect.insort(rooms, (room - n, r))
        else:
            rows.append(PackedRow([i], n))
            bisect.insort(rooms, (capacity - n, len(rows) - 1))
    return rows


def collate_rows(rows: Sequence[Sequence[tuple[list[int], list[int]]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows of ``(ids, loss_mask)`` sequences -> ``input_ids``, ``position_ids``, ``labels`` (B, L), right-padded.

    Padding has position ids continuing from the row's last sequence and label ``IGNORE``; a
    sequence's first label is ``IGNORE`` too.
    """
    flat = []
    for row in rows:
        ids: list[int] = []
        pos: list[int] = []
        labels: list[int] = []
        for seq_ids, mask in row:
            ids += seq_ids
            pos += list(range(len(seq_ids)))
            labels += [IGNORE] + [t if m else IGNORE for t, m in zip(seq_ids[1:], mask[1:])]
        flat.append((ids, pos, labels))
    width = max((len(f[0]) for f in flat), default=0)
    out = {
        k: torch.full((len(flat), width), v, dtype=torch.long) for k, v in (("input_ids", pad_id), ("labels", IGNORE))
    }
    out["position_ids"] = torch.zeros((len(flat), width), dtype=torch.long)
    for b, (ids, pos, labels) in enumerate(flat):
        n = len(ids)
        out["input_ids"][b, :n] = torch.tensor(ids)
        out["labels"][b, :n] = torch.tensor(labels)
        start = (pos[-1] + 1) if pos else 0
        out["position_ids"][b, :n] = torch.tensor(pos)
        out["position_ids"][b, n:] = torch.arange(start, start + width - n)
    return out


def packed_logits(model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Logits of packed rows (B, L, V): no attention mask, restarting position ids, and no KV cache."""
    return model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **kwargs).logits


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log p(labels[t] | ...)`` read from ``logits[t-1]`` -> (B, L); 0 where the label is ``IGNORE``.

    Position t of the result scores token t (the first column is always 0: nothing predicts it).
    """
    shifted = logits[:, :-1].float()
    if temperature != 1.0:
        shifted = shifted / temperature
    targets = labels[:, 1:]
    valid = targets != IGNORE
    logp = torch.log_softmax(shifted, dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(labels.shape, dtype=logp.dtype, device=logp.device)
    out[:, 1:] = torch.where(valid, logp, torch.zeros_like(logp))
    return out
