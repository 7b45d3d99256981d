"""Procedurally drawn coloured shapes with captions: generator training data a CPU makes in milliseconds.

Why: no image-caption dataset and no pretrained VAE install offline, and a random tiny VAE barely
lets latents move image statistics (channel means by <= 0.03, research notes), so rewards would have
nothing to act on. A scene here is one shape (circle, square, triangle) of a named colour on a named
background colour, optionally moving (video); its caption says so ("a red circle on a blue
background"). The tiny VAE is pretrained on these scenes and the generator is fine-tuned on their
captions, after which brightness, JPEG size and colour-word match all respond to the latents.

Everything is a function of a ``numpy`` Generator, so a seed fixes a dataset.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BACKGROUNDS",
    "COLORS",
    "SHAPES",
    "Scene",
    "caption",
    "draw",
    "is_heldout",
    "random_scene",
    "random_scenes",
    "scene_batch",
]

# object colours (RGB); the colour-match reward scores pixels by their nearest entry
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 215, 50),
    "purple": (140, 50, 180),
    "orange": (240, 140, 30),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (15, 15, 15),
    "gray": (128, 128, 128),
    "white": (240, 240, 240),
}
SHAPES = ("circle", "square", "triangle")


@dataclass(frozen=True)
class Scene:
    """One shape on a background; ``(x, y)`` the centre and ``size`` the half-width, both in [0, 1] of the
    frame; ``(vx, vy)`` the motion per frame (video)."""

    shape: str
    color: str
    background: str
    x: float
    y: float
    size: float
    vx: float = 0.0
    vy: float = 0.0


def _where(scene: Scene) -> str:
    col = ("left", "centre", "right")[min(int(scene.x * 3), 2)]
    row = ("top", "middle", "bottom")[min(int(scene.y * 3), 2)]
    return "the centre" if (row, col) == ("middle", "centre") else f"the {row} {col}".replace("middle ", "")


def caption(scene: Scene) -> str:
    """``"a large red circle at the top left on a gray background"`` (at the first frame's position)."""
    size = "small" if scene.size < 0.25 else "large"
    return f"a {size} {scene.color} {scene.shape} at {_where(scene)} on a {scene.background} background"


def is_heldout(text: str) -> bool:
    """One caption in five, by a hash of its text, is never trained on (held-out prompts)."""
    return zlib.crc32(text.encode()) % 5 == 0


def random_scene(rng: np.random.Generator, moving: bool = False) -> Scene:
    size = float(rng.uniform(0.18, 0.32))
    x, y = (float(v) for v in rng.uniform(size, 1 - size, 2))
    vx, vy = (float(v) for v in rng.uniform(-0.04, 0.04, 2)) if moving else (0.0, 0.0)
    return Scene(
        shape=str(rng.choice(SHAPES)),
        color=str(rng.choice(list(COLORS))),
        background=str(rng.choice(list(BACKGROUNDS))),
        x=x,
        y=y,
        size=size,
        vx=vx,
        vy=vy,
    )


def _mask(shape: str, x: float, y: float, size: float, n: int) -> np.ndarray:
    coords = (np.arange(n) + 0.5) / n
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    dx, dy = xx - x, yy - y
    if shape == "circle":
        return np.asarray(dx**2 + dy**2 <= size**2)
    if shape == "square":
        return np.asarray((np.abs(dx) <= size * 0.85) & (np.abs(dy) <= size * 0.85))
    if shape == "triangle":  # apex up: inside when below the two edges and above the base
        return np.asarray((dy <= size * 0.8) & (dy >= -size) & (np.abs(dx) <= (dy + size) * 0.55))
    raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def draw(scene: Scene, size: int = 64, frames: int = 1) -> np.ndarray:
    """``(frames, size, size, 3)`` uint8; a moving scene's shape bounces off the frame's edges."""
    out = np.empty((frames, size, size, 3), np.uint8)
    x, y, vx, vy = scene.x, scene.y, scene.vx, scene.vy
    lo, hi = scene.size, 1 - scene.size
    for f in range(frames):
        img = np.empty((size, size, 3), np.uint8)
        img[:] = BACKGROUNDS[scene.background]
        img[_mask(scene.shape, x, y, scene.size, size)] = COLORS[scene.color]
        out[f] = img
        x, y = x + vx, y + vy
        if not lo <= x <= hi:
            vx, x = -vx, min(max(x, lo), hi)
        if not lo <= y <= hi:
            vy, y = -vy, min(max(y, lo), hi)
    return out


def random_scenes(rng: np.random.Generator, n: int, moving: bool = False, heldout: bool | None = None) -> list[Scene]:
    """``n`` random scenes; ``heldout`` True / False keeps only held-out / training captions (None: any)."""
    out: list[Scene] = []
    while len(out) < n:
        scene = random_scene(rng, moving)
        if heldout is None or is_heldout(caption(scene)) == heldout:
            out.append(scene)
    return out


def scene_batch(
    rng: np.random.Generator, n: int, size: int = 64, frames: int = 1, heldout: bool | None = None
) -> tuple[np.ndarray, list[str]]:
    """``n`` random scenes: pixels ``(n, 3, frames, size, size)`` float32 in [-1, 1] and their captions."""
    scenes = random_scenes(rng, n, moving=frames > 1, heldout=heldout)
    pixels = np.stack([draw(s, size, frames) for s in scenes]).astype(np.float32) / 127.5 - 1.0
    return pixels.transpose(0, 4, 1, 2, 3).copy(), [caption(s) for s in scenes]
