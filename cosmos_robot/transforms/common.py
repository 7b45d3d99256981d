"""The transforms most policies need: rename/select keys, resize images, (un)normalise, fix action dims."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from cosmos_robot.normalize import FeatureStats, NormMode
from cosmos_robot.transforms.base import register_transform

__all__ = [
    "BinarizeActions",
    "NormalizeKeys",
    "PadOrSliceActions",
    "RenameKeys",
    "ResizeImages",
    "SelectKeys",
    "UnnormalizeKeys",
]


@register_transform
@dataclass(frozen=True)
class RenameKeys:
    """``{"observation/image": "image"}``: wire names -> model names (missing keys are left alone)."""

    mapping: dict[str, str]

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        return {self.mapping.get(k, k): v for k, v in data.items()}


@register_transform
@dataclass(frozen=True)
class SelectKeys:
    """Keep only ``keys``; a missing required key is an error naming it and what was sent."""

    keys: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        missing = [k for k in self.keys if k not in data]
        if missing:
            raise KeyError(f"observation is missing {missing} (got keys {sorted(data)})")
        return {k: data[k] for k in (*self.keys, *self.optional) if k in data}


@register_transform
@dataclass(frozen=True)
class ResizeImages:
    """Resize HWC uint8 images to ``height`` x ``width`` (bilinear); a no-op when already that size."""

    keys: tuple[str, ...]
    height: int
    width: int

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        out = dict(data)
        for key in self.keys:
            if key not in out:
                continue
            img = np.asarray(out[key])
            if img.ndim != 3 or img.shape[-1] != 3:
                raise ValueError(f"{key}: expected an HxWx3 image, got shape {img.shape}")
            if img.shape[:2] != (self.height, self.width):
                if img.dtype != np.uint8:
                    img = np.clip(img * (255.0 if img.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
                img = np.asarray(Image.fromarray(img).resize((self.width, self.height), Image.Resampling.BILINEAR))
            out[key] = img
        return out


@dataclass(frozen=True)
class _StatsTransform:
    """Shared body of (un)normalisation: per-key stats parsed once, checked against each value."""

    stats: dict[str, dict[str, Any]]
    mode: NormMode = "mean_std"
    keys: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        parsed = {k: FeatureStats.from_dict(v, name=f"stats[{k!r}]") for k, v in self.stats.items()}
        missing = [k for k in self.keys if k not in parsed]
        if missing:
            raise ValueError(f"{type(self).__name__}: no stats for keys {missing} (have {sorted(parsed)})")
        object.__setattr__(self, "_parsed", parsed)

    def _apply(self, data: dict[str, Any], inverse: bool) -> dict[str, Any]:
        out = dict(data)
        parsed: dict[str, FeatureStats] = self._parsed  # type: ignore[attr-defined]
        for key in self.keys or tuple(parsed):
            if key not in out:
                continue
            st = parsed[key]
            x = np.asarray(out[key], dtype=np.float32)
            if x.shape[-1] != st.mean.shape[0]:
                raise ValueError(f"{key}: expected last dimension {st.mean.shape[0]}, got shape {x.shape}")
            out[key] = st.unnormalize(x, self.mode) if inverse else st.normalize(x, self.mode)
        return out


@register_transform
@dataclass(frozen=True)
class NormalizeKeys(_StatsTransform):
    """Normalise ``keys`` (default: every key with stats) with per-key stats ``{"state": {"mean": ...}}``."""

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        return self._apply(data, inverse=False)


@register_transform
@dataclass(frozen=True)
class UnnormalizeKeys(_StatsTransform):
    """The inverse of ``NormalizeKeys`` (used on ``actions`` coming out of the model)."""

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        return self._apply(data, inverse=True)


@register_transform
@dataclass(frozen=True)
class PadOrSliceActions:
    """Make ``actions``' last dimension ``dim`` (slice padded model outputs, zero-pad short ones)."""

    dim: int
    key: str = "actions"

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        out = dict(data)
        a = np.asarray(out[self.key])
        if a.shape[-1] > self.dim:
            a = a[..., : self.dim]
        elif a.shape[-1] < self.dim:
            pad = [(0, 0)] * (a.ndim - 1) + [(0, self.dim - a.shape[-1])]
            a = np.pad(a, pad)
        out[self.key] = a
        return out


@register_transform
@dataclass(frozen=True)
class BinarizeActions:
    """Snap action dims ``dims`` to ``low`` / ``high`` by the sign of ``value - threshold`` (a gripper).

    Why: a flow policy regresses the demonstrations' open (-1) / close (+1) gripper command and, where
    it is unsure, answers in between; on the tabletop suite a command near 0 puts the fingers at the
    cube's faces without squeezing, and the cube slips. Robot stacks (OpenVLA's LIBERO evaluation, most
    real grippers) execute the sign instead. Applied after ``UnnormalizeKeys`` (env units), so serving,
    evaluation and RL rollouts execute the same binarised command.
    """

    dims: tuple[int, ...]
    threshold: float = 0.0
    low: float = -1.0
    high: float = 1.0
    key: str = "actions"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        if not self.dims or any(d < 0 for d in self.dims) or len(set(self.dims)) != len(self.dims):
            raise ValueError(f"BinarizeActions.dims: expected distinct indices >= 0, got {list(self.dims)}")

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        out = dict(data)
        a = np.array(out[self.key], copy=True)
        if max(self.dims) >= a.shape[-1]:
            raise ValueError(
                f"BinarizeActions: {self.key!r} has {a.shape[-1]} dims per step, dims {list(self.dims)} asked for"
            )
        d = list(self.dims)
        a[..., d] = np.where(a[..., d] >= self.threshold, self.high, self.low).astype(a.dtype)
        out[self.key] = a
        return out
