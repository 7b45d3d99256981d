"""Seeding, determinism and RNG snapshots: what exact resume needs besides weights and optimizer.

Why snapshot every generator (torch, numpy, python) instead of re-seeding on resume: a run killed
at step k and resumed must draw the same noise, timesteps and augmentation as the uninterrupted run
at step k + 1, whichever library a model or transform happens to draw from. The snapshot holds only
tensors and plain containers, so it loads with ``torch.load(weights_only=True)`` (no pickle of
arbitrary objects).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "configure_torch", "restore_rng_state", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU, and CUDA when present) from one integer."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def configure_torch(num_threads: int | None, deterministic: bool) -> None:
    """Thread count and deterministic kernels.

    On a CPU the remaining source of run-to-run difference is the thread count (reductions split
    differently), so a resumed run should use the same ``num_threads`` as the run it continues.
    ``warn_only``: an op without a deterministic kernel warns instead of failing a long run.
    Deterministic mode also turns TF32 off on CUDA (full float32 convolutions and matmuls).
    """
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    if deterministic:
        # TF32 convolutions round differently at different batch sizes: on an H200 the PPO ratio of a
        # rollout (batch = envs) recomputed by the learner (batch = minibatch) was off by 1.2e-3 with
        # cuDNN's TF32 on, 4e-6 with it off
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")


def capture_rng_state() -> dict[str, Any]:
    """The state of every global generator, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put every global generator back where ``capture_rng_state`` found it."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
