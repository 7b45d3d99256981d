"""Demonstrations as training batches: record if missing, load into memory, normalise, augment.

Why in memory and not a ``DataLoader``: a tabletop demo set is ~10k frames (a few hundred MB of
uint8 at 64 px), so indexing tensors is faster on two CPU cores than worker processes, and the batch
order is then a pure function of the sampler's position (exact resume). Images stay uint8 until
the model; state and action chunks are normalised once, here, with the stats the exported policy
will carry, so training sees exactly what serving feeds the model.

Augmentation (training only) draws from the trainer's generator, whose state is checkpointed:
``random_shift`` is DrQ's pad-and-crop (edge padding), the cheapest augmentation that makes image
policies robust to small viewpoint / layout shifts; brightness / contrast jitter is optional.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.data.loader import first_episodes_per_task
from cosmos_robot.normalize import FeatureStats
from cosmos_robot.policies.flow import FlowConfig, encode_prompts
from cosmos_robot_trainers.common.sampler import task_weights
from cosmos_robot_trainers.sft.config import AugmentConfig, DataConfig

__all__ = ["FrameSet", "TrainData", "augment_images", "ensure_dataset", "load_train_data", "task_weights"]


def ensure_dataset(cfg: DataConfig, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Record ``cfg.root`` from the scripted experts when it is missing (or resume its interrupted
    recording) and ``record_if_missing``.

    Returns the recorder's summary when it recorded, None when the dataset was already there. A
    recording that was killed is refused by the recorder (and the loader) with the fix.
    """
    from cosmos_robot.data.local import recording_status

    root = Path(cfg.root)
    status = recording_status(root)
    if status in ("complete", "unrecorded") or (status != "missing" and not cfg.record_if_missing):
        return None  # the loader checks it is whole (an interrupted or killed one is refused with the fix)
    if not cfg.record_if_missing:
        raise FileNotFoundError(
            f"data.root: {root} is not a recorded dataset (no meta/info.json); record it with "
            f"`cosmos-robot record --out {root}` or set data.record_if_missing = true"
        )
    from cosmos_robot.data.record import RecordConfig, record_demonstrations

    log(
        f"{'resuming the interrupted recording of' if status == 'interrupted' else 'recording'} "
        f"{cfg.episodes_per_task} expert episodes per task ({', '.join(cfg.tasks)}) "
        f"at {cfg.record_image_size} px into {root}"
    )
    record = RecordConfig(
        suite=cfg.suite,
        cameras=cfg.record_cameras,
        expert_noise=cfg.record_expert_noise,
        noise_tasks=tuple(cfg.record_noise_tasks),
        max_steps=cfg.record_max_steps,
        repo_id=f"local/cosmos_robot_{cfg.suite}",
        tasks=tuple(cfg.tasks),
        episodes_per_task=cfg.episodes_per_task,
        image_size=cfg.record_image_size,
        seed=cfg.record_seed,
        num_envs=cfg.record_num_envs,
        vector_mode="async" if cfg.record_num_envs > 1 else "sync",
    )
    return record_demonstrations(record, root)


class FrameSet:
    """What every SFT data kind shares: one prompt per sample, task weighting, a resume fingerprint."""

    prompts: list[str]
    actions: torch.Tensor
    num_episodes: int

    def __len__(self) -> int:
        return len(self.prompts)

    def sample_weights(self, weighting: str) -> np.ndarray | None:
        return task_weights(self.prompts, weighting)

    def content_sums(self) -> dict[str, Any]:
        """Sums over the kind's inputs (a resumed run must see the same numbers)."""
        return {}

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed run checks: the same samples in the same order."""
        actions = round(float(self.actions.double().sum()), 6)
        return {"samples": len(self), "episodes": self.num_episodes, **self.content_sums(), "actions_sum": actions}

    def loss_mass(self, batch: dict[str, Any]) -> float:
        """What the family's loss divides by, up to a constant: the real (unpadded) action steps. A
        data-parallel rank weighs its loss by its share of the global batch's mass, so that the average
        over ranks is the global batch's loss, not a mean of per-rank means."""
        return float((~batch["action_pad_mask"].bool()).sum())

    def shard_batch(self, batch: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
        """Samples ``lo:hi`` of a batch this kind made (a data-parallel rank's slice): every entry along its
        first axis; a kind whose batch holds other layouts overrides it."""
        n = int(batch["actions"].shape[0])
        out = {}
        for key, value in batch.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != n:
                raise TypeError(f"shard_batch: {key!r} is not batch-major ({type(self).__name__} must override it)")
            out[key] = value[lo:hi]
        return out


@dataclass
class TrainData(FrameSet):
    """Normalised, in-memory training samples and the stats the exported policy carries."""

    images: torch.Tensor  # (N, ncam, 3, S, S) uint8
    state: torch.Tensor  # (N, state_dim) float32, normalised (the model's state_keys concatenated)
    actions: torch.Tensor  # (N, chunk_size, action_dim) float32, normalised
    pad_mask: torch.Tensor  # (N, chunk_size) bool, True past the episode's end
    prompts: list[str]  # (N,) instruction per sample
    stats: dict[str, FeatureStats]  # {"state": ..., "actions": ...} in env units
    num_episodes: int

    def content_sums(self) -> dict[str, Any]:
        return {"state_sum": round(float(self.state.double().sum()), 6)}

    def batch(
        self, indices: np.ndarray, augment: AugmentConfig | None, generator: torch.Generator, text_buckets: int
    ) -> dict[str, Any]:
        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        images = self.images[idx]
        if augment is not None:
            images = augment_images(images, augment, generator)
        ids, offsets = encode_prompts([self.prompts[i] for i in idx.tolist()], text_buckets)
        return {
            "images": images,
            "state": self.state[idx],
            "actions": self.actions[idx],
            "action_pad_mask": self.pad_mask[idx],
            "text_ids": ids,
            "text_offsets": offsets,
        }

    def shard_batch(self, batch: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
        """As the base, and the prompts' flat bucket ids cut at their offsets."""
        ids, offsets = batch["text_ids"], batch["text_offsets"]
        end = int(offsets[hi]) if hi < offsets.shape[0] else int(ids.shape[0])
        rest = {k: v for k, v in batch.items() if k not in ("text_ids", "text_offsets")}
        out = super().shard_batch(rest, lo, hi)
        out["text_ids"] = ids[int(offsets[lo]) : end]
        out["text_offsets"] = offsets[lo:hi] - offsets[lo]
        return out


def augment_images(images: torch.Tensor, cfg: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """Random shift (per sample and camera) and photometric jitter of a uint8 ``(B, ncam, 3, S, S)`` batch."""
    if cfg.random_shift == 0 and cfg.brightness == 0 and cfg.contrast == 0:
        return images
    b, n, c, h, w = images.shape
    x = images.reshape(b * n, c, h, w)
    if cfg.random_shift > 0:
        pad = cfg.random_shift
        dy = torch.randint(-pad, pad + 1, (b * n,), generator=generator)
        dx = torch.randint(-pad, pad + 1, (b * n,), generator=generator)
        rows = (torch.arange(h)[None, :] + dy[:, None]).clamp_(0, h - 1)  # edge padding = clamped indices
        cols = (torch.arange(w)[None, :] + dx[:, None]).clamp_(0, w - 1)
        batch_idx = torch.arange(b * n)[:, None, None]
        x = x.permute(0, 2, 3, 1)[batch_idx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if cfg.brightness > 0 or cfg.contrast > 0:
        f = x.float()
        if cfg.contrast > 0:
            scale = 1.0 + (torch.rand(b * n, 1, 1, 1, generator=generator) * 2 - 1) * cfg.contrast
            mean = f.mean(dim=(1, 2, 3), keepdim=True)
            f = (f - mean) * scale + mean
        if cfg.brightness > 0:
            f = f * (1.0 + (torch.rand(b * n, 1, 1, 1, generator=generator) * 2 - 1) * cfg.brightness)
        x = f.round_().clamp_(0, 255).to(torch.uint8)
    return x.contiguous().reshape(b, n, c, h, w)


def load_train_data(cfg: DataConfig, model: FlowConfig) -> TrainData:
    """Load ``cfg.root`` at the model's image size / cameras / chunk_size and normalise it."""
    from cosmos_robot.data.loader import compute_norm_stats, load_demonstrations
    from cosmos_robot.data.schema import ACTION, STATE

    demo = load_demonstrations(
        cfg.root,
        chunk_size=model.chunk_size,
        image_size=model.image_size,
        cameras=tuple(model.cameras),
        state_keys=tuple(model.state_keys),
    )
    keep = first_episodes_per_task(demo.episode_index.numpy(), demo.prompts, cfg.max_episodes_per_task)
    if keep is not None:
        demo.images, demo.state, demo.actions = demo.images[keep], demo.state[keep], demo.actions[keep]
        demo.action_is_pad, demo.episode_index = demo.action_is_pad[keep], demo.episode_index[keep]
        demo.prompts = [demo.prompts[i] for i in keep.tolist()]
    raw = compute_norm_stats(demo)
    stats = {"state": raw[STATE], "actions": raw[ACTION]}
    mode = model.norm_mode
    state = stats["state"].normalize(demo.state.numpy(), mode)
    actions = torch.from_numpy(np.ascontiguousarray(stats["actions"].normalize(demo.actions.numpy(), mode)))
    pad = demo.action_is_pad.bool()
    actions[pad] = 0.0  # padded steps are excluded from the loss; keep them finite and tidy
    return TrainData(
        images=demo.images.contiguous(),
        state=torch.from_numpy(np.ascontiguousarray(state)),
        actions=actions,
        pad_mask=pad,
        prompts=list(demo.prompts),
        stats=stats,
        num_episodes=demo.num_episodes,
    )
