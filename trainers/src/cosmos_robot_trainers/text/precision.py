"""float32 master weights for text models trained in bfloat16.

Why: the GPU recipes keep the model in bf16 (rollouts, scoring and the update all run on it), and
AdamW moves each weight by about the learning rate. bf16 keeps 8 significant bits: a weight near
0.02 can only move in steps of about 8e-5, so the 1e-6 updates of RL recipes (1e-5 for a critic)
round away and the model never changes. ``MasterWeights`` is the classic mixed-precision optimizer:
an fp32 copy of the model holds the weights AdamW updates; after each step the bf16 model is set to
the rounded copy, so many small updates add up. Gradient clipping stays on the model's own gradients
(before ``step``); the scheduler drives the inner AdamW. ``state_dict`` carries the fp32 copy, so a
resumed run continues from the same master weights (exact resume).

``build_text_optimizer`` is the text trainers' one entry: AdamW for fp32 models, ``MasterWeights``
around it for bf16 / fp16 ones.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from cosmos_robot_trainers.sft.optim import build_optimizer

__all__ = ["MasterWeights", "build_text_optimizer"]


class MasterWeights:
    """AdamW on an fp32 copy of ``model``, copied back into ``model`` (rounded to its dtype) after each step."""

    def __init__(self, model: torch.nn.Module, master: torch.nn.Module, inner: torch.optim.Optimizer) -> None:
        self.model, self.master, self.inner = model, master, inner
        self.pairs = [(p, m) for p, m in zip(model.parameters(), master.parameters(), strict=True) if p.requires_grad]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in self.pairs:
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, m in self.pairs:
            p.copy_(m)

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "master": [m.detach().clone() for _, m in self.pairs]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"inner", "master"} or len(state["master"]) != len(self.pairs):
            raise ValueError(
                "optimizer state: expected float32 master weights for this bfloat16 model (a checkpoint of a "
                "float32 run cannot resume as a bfloat16 one)"
            )
        for (_, m), saved in zip(self.pairs, state["master"], strict=True):
            m.copy_(saved)
        self.inner.load_state_dict(state["inner"])


def build_text_optimizer(model: torch.nn.Module, cfg: Any, total_steps: int) -> tuple[Any, Any]:
    """(optimizer, scheduler): AdamW for a float32 model; AdamW on float32 master weights for a half-precision one."""
    if next(model.parameters()).dtype == torch.float32:
        return build_optimizer(model, cfg, total_steps)
    master = copy.deepcopy(model).float()
    inner, scheduler = build_optimizer(master, cfg, total_steps)
    return MasterWeights(model, master, inner), scheduler
