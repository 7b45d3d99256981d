"""The forward process the generator losses share: draw sigma and noise, noise the latents, one update.

Flow matching in the pipeline's convention (``cosmos_robot.generation.cosmos3``): ``x_t = (1 - s) x0 +
s eps``, target velocity ``eps - x0``, transformer timestep ``s * 1000``. SFT regresses the velocity
on data latents; Flow-DPO compares the errors of winner and loser under the same ``(s, eps)``;
DiffusionNFT regresses on sampled latents with implicit positive and negative policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cosmos_robot_trainers.common import fsdp

__all__ = ["draw_sigmas", "noised", "optimizer_step", "prompt_ids"]


def draw_sigmas(n: int, generator: torch.Generator, mode: str) -> torch.Tensor:
    """``(n,)`` noise levels in (0, 1): logit-normal (SD3's default) or uniform on [0.001, 0.999]."""
    if mode == "logit_normal":
        return torch.sigmoid(torch.randn(n, generator=generator))
    if mode == "uniform":
        return 0.001 + 0.998 * torch.rand(n, generator=generator)
    raise ValueError(f"train.timestep_sampling: unknown {mode!r}; choose logit_normal or uniform")


def noised(x0: torch.Tensor, eps: torch.Tensor, sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_t, target velocity)`` for latents ``(B, C, T, h, w)`` at per-sample ``sigmas`` ``(B,)``."""
    s = sigmas.view(-1, *([1] * (x0.dim() - 1))).to(x0)
    return (1.0 - s) * x0 + s * eps, eps - x0


def prompt_ids(gen: Any, prompts: Sequence[str], shape: Any, cache: dict[str, list[int]]) -> list[list[int]]:
    """Conditional token ids of each prompt (cached: prompts repeat across steps)."""
    out = []
    for p in prompts:
        if p not in cache:
            cache[p] = gen.prompt_ids(p, shape)[0]
        out.append(cache[p])
    return out


def optimizer_step(run: Any, loss: torch.Tensor, weight: float = 1.0) -> float:
    """Backward of ``weight`` x ``loss`` (a data-parallel rank's share, ``GenRun.share``), gradients averaged
    over ranks, clip (``optim.grad_clip``), AdamW step, schedule step; returns the pre-clip gradient norm."""
    run.optimizer.zero_grad(set_to_none=True)
    (loss * weight if weight != 1.0 else loss).backward()
    params = list(run.trainable.values())
    fsdp.average_gradients(run.gen.transformer, run.world, params)
    norm = fsdp.clip_gradients(params, run.config.optim.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    return norm
