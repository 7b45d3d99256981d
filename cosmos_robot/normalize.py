"""Normalisation statistics: computed from a dataset, saved beside the weights, applied at the edge.

A policy sees normalised state and predicts normalised actions; the stats travel in the checkpoint
folder so ``serve --ckpt`` needs nothing else. Two modes: ``mean_std`` (z-score) and ``min_max``
(to [-1, 1], LeRobot's MIN_MAX; ``q01``/``q99`` quantile bounds when present, openpi/pi05 style).
Dimensions with (near) zero spread pass through unscaled instead of exploding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = ["FeatureStats", "NormMode", "compute_stats"]

NormMode = Literal["mean_std", "min_max", "quantile", "identity"]
_EPS = 1e-6


@dataclass(frozen=True)
class FeatureStats:
    """Per-dimension statistics of one feature (e.g. ``observation.state`` or ``action``)."""

    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def _center_and_scale(self, mode: NormMode) -> tuple[np.ndarray, np.ndarray]:
        """``(center, scale)`` with ``normalized = (x - center) / scale``.

        ``mean_std``: ``(mean, std)``; the bounded modes map ``[low, high]`` onto ``[-1, 1]``: the centre of the
        range and half its span. A (near) zero std or span passes that dimension through unscaled (std 1,
        span 2).
        """
        if mode == "mean_std":
            return self.mean, np.where(self.std < _EPS, 1.0, self.std)
        if mode == "quantile":
            if self.q01 is None or self.q99 is None:
                raise ValueError("quantile normalisation needs q01/q99 in the stats")
            lo, hi = self.q01, self.q99
        else:
            lo, hi = self.min, self.max
        half_span = np.where(hi - lo < _EPS, 2.0, hi - lo) / 2.0
        return lo + half_span, half_span

    def normalize(self, x: np.ndarray, mode: NormMode) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if mode == "identity":
            return x
        center, scale = self._center_and_scale(mode)
        return ((x - center) / scale).astype(np.float32)

    def unnormalize(self, y: np.ndarray, mode: NormMode) -> np.ndarray:
        y = np.asarray(y, dtype=np.float32)
        if mode == "identity":
            return y
        center, scale = self._center_and_scale(mode)
        return (y * scale + center).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k).tolist() for k in ("mean", "std", "min", "max")}
        for k in ("q01", "q99"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v.tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str = "stats") -> FeatureStats:
        missing = [k for k in ("mean", "std", "min", "max") if k not in data]
        if missing:
            raise ValueError(f"{name}: missing {missing} (have {sorted(data)})")
        arrays = {k: np.asarray(data[k], dtype=np.float32).reshape(-1) for k in ("mean", "std", "min", "max")}
        dims = {k: v.shape[0] for k, v in arrays.items()}
        if len(set(dims.values())) != 1:
            raise ValueError(f"{name}: mean/std/min/max have different lengths {dims}")
        q01, q99 = (np.asarray(data[k], dtype=np.float32).reshape(-1) if k in data else None for k in ("q01", "q99"))
        return cls(arrays["mean"], arrays["std"], arrays["min"], arrays["max"], q01, q99)


def compute_stats(x: np.ndarray) -> FeatureStats:
    """Statistics over axis 0 of an ``(N, D)`` array."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    return FeatureStats(
        mean=x.mean(0).astype(np.float32),
        std=x.std(0).astype(np.float32),
        min=x.min(0).astype(np.float32),
        max=x.max(0).astype(np.float32),
        q01=np.quantile(x, 0.01, axis=0).astype(np.float32),
        q99=np.quantile(x, 0.99, axis=0).astype(np.float32),
    )
