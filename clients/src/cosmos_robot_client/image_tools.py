"""Image resizing for robot-side clients, in numpy alone (no PIL, no torch on a robot computer).

Why here: simulators render large frames (RoboLab's cameras are 720x1280) and sending them raw
costs megabytes per request, so clients shrink them first. openpi's clients use
``image_tools.resize_with_pad`` (PIL bilinear, aspect kept, zero padding, centred); DROID policies
were trained on frames prepared that way, so ``resize_with_pad`` here follows the same recipe:
scale by the larger ratio, truncate the scaled size to integers, centre on a black canvas. The
resampling is PIL's bilinear filter (a triangle whose support widens with the downscale factor,
so shrinking averages instead of aliasing), one separable pass per axis over the few source pixels
each output pixel reads, each pass rounded to whole levels as PIL does; results match PIL within one
grey level.
"""

from __future__ import annotations

import numpy as np

__all__ = ["resize", "resize_with_pad"]


def _taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and weights, each (size_out, K): output i = sum_k weights[i, k] * input[index[i, k]]."""
    scale = size_in / size_out
    support = max(scale, 1.0)  # the triangle widens when shrinking
    centers = (np.arange(size_out) + 0.5) * scale
    lo = np.maximum(np.floor(centers - support + 0.5).astype(np.int64), 0)
    hi = np.minimum(np.floor(centers + support + 0.5).astype(np.int64), size_in)
    k = int((hi - lo).max())
    index = lo[:, None] + np.arange(k)[None, :]
    weights = np.clip(1.0 - np.abs((index + 0.5 - centers[:, None]) / support), 0.0, None)
    weights[index >= hi[:, None]] = 0.0
    weights /= np.maximum(weights.sum(axis=1, keepdims=True), 1e-12)
    return np.minimum(index, size_in - 1), weights.astype(np.float32)


def _resample(x: np.ndarray, axis: int, size_out: int) -> np.ndarray:
    index, weights = _taps(x.shape[axis], size_out)
    shape = [1] * x.ndim
    shape[axis] = size_out
    acc = np.zeros(x.shape[:axis] + (size_out,) + x.shape[axis + 1 :], dtype=np.float32)
    for k in range(index.shape[1]):  # a few taps: one gather-multiply-add each
        acc += np.take(x, index[:, k], axis=axis) * weights[:, k].reshape(shape)
    return np.clip(np.floor(acc + 0.5), 0, 255)  # round half up, as PIL does


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """(H, W, C) uint8 -> (height, width, C) uint8, bilinear (antialiased when shrinking)."""
    img = np.asarray(image)
    if img.ndim != 3:
        raise ValueError(f"expected an (H, W, C) image, got shape {img.shape}")
    if height <= 0 or width <= 0:
        raise ValueError(f"target size must be positive, got {height}x{width}")
    if img.shape[:2] == (height, width):
        return img.astype(np.uint8, copy=False)
    x = img.astype(np.float32)
    if img.shape[1] != width:  # horizontal pass first, rounded to whole levels in between (as PIL does)
        x = _resample(x, 1, width)
    if img.shape[0] != height:
        x = _resample(x, 0, height)
    return x.astype(np.uint8)


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Fit ``image`` (H, W, C) inside ``height`` x ``width`` keeping its aspect ratio, centred on black."""
    img = np.asarray(image)
    cur_h, cur_w = img.shape[:2]
    if (cur_h, cur_w) == (height, width):
        return img.astype(np.uint8, copy=False)
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = max(1, int(cur_h / ratio)), max(1, int(cur_w / ratio))
    scaled = resize(img, new_h, new_w)
    out = np.zeros((height, width, img.shape[2]), dtype=np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top : top + new_h, left : left + new_w] = scaled
    return out
