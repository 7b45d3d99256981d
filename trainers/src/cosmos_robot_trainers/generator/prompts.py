"""Training and held-out prompts of a generator run.

``shapes``: captions of procedural scenes (``cosmos_robot.generation.shapes``); one caption in five
(by a hash of its text) is held out, so held-out prompts are never trained on by SFT, DPO or NFT. A
text file: one prompt per line; its last ``eval.prompts`` lines are held out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosmos_robot.generation.shapes import caption, random_scenes

__all__ = ["HELDOUT_SEED_OFFSET", "heldout_prompts", "train_prompts"]

HELDOUT_SEED_OFFSET = 1_000_000


def _file_lines(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"prompts.source: {file} is neither 'shapes' nor a text file")
    lines = [line.strip() for line in file.read_text().splitlines() if line.strip()]
    if len(lines) < 2:
        raise ValueError(f"prompts.source: {file} holds {len(lines)} prompts; need at least 2 (train and held out)")
    return lines


def _shapes(seed: int, count: int, heldout: bool) -> list[str]:
    rng = np.random.default_rng(seed)
    return [caption(s) for s in random_scenes(rng, count, heldout=heldout)]


def train_prompts(cfg: Any, heldout_count: int = 0) -> list[str]:
    if cfg.source == "shapes":
        return _shapes(cfg.seed, cfg.count, heldout=False)
    lines = _file_lines(cfg.source)
    keep = lines[: len(lines) - heldout_count] if heldout_count < len(lines) else []
    if not keep:
        raise ValueError(f"prompts.source: {cfg.source} has {len(lines)} lines, all held out (eval.prompts)")
    return keep


def heldout_prompts(cfg: Any, count: int) -> list[str]:
    if cfg.source == "shapes":
        return _shapes(cfg.seed + HELDOUT_SEED_OFFSET, count, heldout=True)
    return _file_lines(cfg.source)[-count:]
