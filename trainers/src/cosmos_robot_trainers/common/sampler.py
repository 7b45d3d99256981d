"""A seeded batch sampler whose whole state is one integer: the number of batches already drawn.

Why not ``torch.utils.data.RandomSampler`` + ``DataLoader``: their position cannot be checkpointed
(a resumed loader starts a fresh epoch), so a killed-and-resumed run would see different batches
than an uninterrupted one. Here batch ``b`` is a pure function of ``(seed, b)``: epoch
``b // batches_per_epoch`` shuffles the dataset with a generator seeded by ``(seed, epoch)``, and the
batch is a slice of that permutation (the last partial batch of an epoch is dropped).

With ``weights`` (e.g. to balance tasks of very different episode lengths), an epoch is instead
``num_items`` draws with replacement, item ``i`` with probability ``weights[i] / sum(weights)``,
from the same ``(seed, epoch)`` generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EpochBatchSampler", "task_weights"]


class EpochBatchSampler:
    """Draw index batches of ``batch_size`` from ``range(num_items)``, reproducibly and resumably."""

    def __init__(self, num_items: int, batch_size: int, seed: int, weights: np.ndarray | None = None) -> None:
        if num_items < 1:
            raise ValueError("EpochBatchSampler: the dataset is empty")
        if batch_size < 1:
            raise ValueError(f"EpochBatchSampler: batch_size must be >= 1, got {batch_size}")
        self.num_items = num_items
        self.batch_size = min(batch_size, num_items)
        self.seed = seed
        self.batches_drawn = 0
        self._p: np.ndarray | None = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (num_items,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
                raise ValueError(f"EpochBatchSampler: weights must be {num_items} finite numbers >= 0, not all 0")
            self._p = w / w.sum()
        self._epoch = -1
        self._perm: np.ndarray = np.arange(num_items)

    @property
    def batches_per_epoch(self) -> int:
        return self.num_items // self.batch_size

    @property
    def epoch(self) -> float:
        """Fractional epochs completed (for logs)."""
        return self.batches_drawn / self.batches_per_epoch

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            if self._p is None:
                self._perm = rng.permutation(self.num_items)
            else:
                self._perm = rng.choice(self.num_items, size=self.num_items, replace=True, p=self._p)
            self._epoch = epoch
        return self._perm

    def next_indices(self) -> np.ndarray:
        epoch, k = divmod(self.batches_drawn, self.batches_per_epoch)
        perm = self._permutation(epoch)
        self.batches_drawn += 1
        return perm[k * self.batch_size : (k + 1) * self.batch_size]

    def state_dict(self) -> dict[str, Any]:
        return {
            "batches_drawn": self.batches_drawn,
            "num_items": self.num_items,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("num_items", "batch_size", "seed"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"sampler state: {key} was {state[key]} when saved, now {getattr(self, key)} "
                    "(the dataset or batch size changed since the checkpoint)"
                )
        self.batches_drawn = int(state["batches_drawn"])


def task_weights(prompts: list[str], weighting: str) -> np.ndarray | None:
    """Per-sample weights for the sampler: None (uniform over frames) or equal mass per instruction."""
    if weighting == "frames":
        return None
    _, inverse, counts = np.unique(np.asarray(prompts), return_inverse=True, return_counts=True)
    return np.asarray(1.0 / counts[inverse], dtype=np.float64)
