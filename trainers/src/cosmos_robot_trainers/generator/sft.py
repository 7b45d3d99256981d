"""``generator_sft``: flow-matching fine-tuning of a Cosmos3 generator on image/video-caption pairs.

Data: procedural shapes scenes (``data.source = "shapes"``; captions of held-out prompts excluded) or a
folder of ``<name>.png`` (an image) or ``<name>/`` (a clip: frame PNGs in name order) each with a
``<name>.txt`` caption. Every item is encoded once by the frozen VAE; a step draws a batch (resumable
sampler), noise levels and noise, and regresses the transformer's velocity on ``eps - x0``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.distributed import mean_over_ranks
from cosmos_robot.generation.shapes import caption, draw, random_scenes
from cosmos_robot_trainers.common import EpochBatchSampler
from cosmos_robot_trainers.generator.config import GenSFTConfig
from cosmos_robot_trainers.generator.flow import draw_sigmas, noised, optimizer_step, prompt_ids
from cosmos_robot_trainers.generator.run import GenResult, GenRun

__all__ = ["load_pairs", "run_generator_sft"]


def _read_png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def _folder_pairs(folder: Path, frames: int, height: int, width: int) -> tuple[np.ndarray, list[str]]:
    if not folder.is_dir():
        raise ValueError(f"data.source: {folder} is neither 'shapes' nor a folder")
    items, captions = [], []
    for txt in sorted(folder.glob("*.txt")):
        media = txt.with_suffix(".png") if frames == 1 else txt.with_suffix("")
        if frames == 1 and not media.is_file():
            raise ValueError(f"{txt}: no image {media.name} beside the caption")
        if frames > 1 and not media.is_dir():
            raise ValueError(f"{txt}: no clip folder {media.name}/ beside the caption")
        clip = [_read_png(media)] if frames == 1 else [_read_png(p) for p in sorted(media.glob("*.png"))[:frames]]
        if len(clip) != frames:
            raise ValueError(f"{media}: {len(clip)} frames, the recipe generates {frames} (shape.num_frames)")
        arr = np.stack(clip)
        if arr.shape[1:3] != (height, width):
            raise ValueError(
                f"{media}: frames of {arr.shape[1]}x{arr.shape[2]}, the recipe's shape is {height}x{width}"
            )
        items.append(arr)
        captions.append(txt.read_text().strip())
    if not items:
        raise ValueError(f"data.source: {folder} has no <name>.txt captions")
    return np.stack(items), captions


def load_pairs(config: GenSFTConfig) -> tuple[np.ndarray, list[str]]:
    """``(N, F, H, W, 3)`` uint8 media and their captions."""
    d, s = config.data, config.shape
    if d.source != "shapes":
        return _folder_pairs(Path(d.source), s.num_frames, s.height, s.width)
    if s.height != s.width:
        raise ValueError("data.source = 'shapes' draws square scenes: set shape.height == shape.width")
    scenes = random_scenes(np.random.default_rng(d.seed), d.count, moving=s.num_frames > 1, heldout=False)
    return np.stack([draw(sc, s.height, s.num_frames) for sc in scenes]), [caption(sc) for sc in scenes]


@torch.no_grad()
def encode_all(run: GenRun, media: np.ndarray, batch: int = 64) -> torch.Tensor:
    pixels = torch.from_numpy(media).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0  # (N, 3, F, H, W)
    return torch.cat([run.gen.encode(pixels[i : i + batch]).cpu() for i in range(0, len(pixels), batch)])


def run_generator_sft(
    config: GenSFTConfig, *, resume: bool, overwrite: bool, log: Callable[[str], None], stop_at_step: int | None = None
) -> GenResult:
    run = GenRun(config, resume=resume, overwrite=overwrite, log=log)
    media, captions = load_pairs(config)
    latents = encode_all(run, media)
    log(f"data: {len(captions)} captioned {'images' if config.shape.num_frames == 1 else 'clips'}, latents "
        f"{tuple(latents.shape[1:])}")  # fmt: skip
    sampler = EpochBatchSampler(len(captions), config.train.batch_size, config.train.seed)

    def load_extra(extra: dict[str, Any]) -> None:
        sampler.load_state_dict(extra["sampler"])

    run.restore(load_extra)
    ids_cache: dict[str, list[int]] = {}

    def step(_: int) -> dict[str, float]:
        idx = sampler.next_indices()
        x0 = latents[idx].to(run.gen.device)
        eps = torch.randn(x0.shape, generator=run.generator).to(x0)
        sigmas = draw_sigmas(len(idx), run.generator, config.train.timestep_sampling)
        rows, weight = run.share(len(idx))  # the whole batch's draws, this rank's rows of them
        x_t, target = noised(x0[rows], eps[rows], sigmas[rows])
        ids = prompt_ids(run.gen, [captions[i] for i in idx[rows]], run.shape, ids_cache)
        v = run.gen.velocities(x_t, sigmas[rows], ids, run.shape)
        loss = torch.nn.functional.mse_loss(v, target)
        norm = optimizer_step(run, loss, weight)
        return {"loss": mean_over_ranks(float(loss.detach()) * weight, run.world), "grad_norm": norm}

    return run.loop(step, stop_at_step=stop_at_step, extra_state=lambda: {"sampler": sampler.state_dict()})
