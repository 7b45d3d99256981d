"""Training weights -> a servable policy folder (``final/``): the same format ``serve --ckpt`` reads.

Why through the policy's own ``save_pretrained``: every family's folder format stays the family's
(ours, LeRobot's, ...), and ``final/`` carries the normalisation stats the data were trained with.
The folder is written to ``<out>.tmp`` and renamed (no half-written ``final/``), and gets a manifest of
file checksums that ``serve --ckpt`` / ``eval --ckpt`` verify.

``EMA``: an exponential moving average of the parameters (SFT exports it when the recipe keeps one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["EMA", "export_policy"]


class EMA:
    """Exponential moving average of the parameters, warmed up (decay ``min(d, (1 + n) / (10 + n))``).

    Under FSDP the shadow of a sharded parameter is a DTensor with the parameter's placement: each rank
    averages its own shard, with no communication. ``state_dict`` gathers whole tensors (a collective
    then: every rank calls it), so a checkpoint is the one-process one and resumes at any world size.
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self.shadow = {name: p.detach().clone() for name, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        names = list(self.shadow)
        params = dict(model.named_parameters())
        torch._foreach_lerp_(
            [_local(self.shadow[n]) for n in names], [_local(params[n].detach()) for n in names], 1.0 - d
        )

    def state_dict(self) -> dict[str, Any]:
        """Whole tensors on the CPU (gathered from the shards under FSDP: every rank calls it)."""
        return {"decay": self.decay, "updates": self.updates, "shadow": {n: _whole(t) for n, t in self.shadow.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From whole tensors (every rank passes all of them); a sharded shadow keeps its own shard."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        self.updates = int(state["updates"])
        for name, value in state["shadow"].items():
            target = self.shadow[name]
            if isinstance(target, DTensor):
                value = distribute_tensor(
                    value.to(target.device, target.dtype), target.device_mesh, target.placements, src_data_rank=None
                )
            _local(target).copy_(_local(value))

    def whole(self) -> EMA:
        """This EMA with whole tensors (itself when nothing is sharded; a collective under FSDP)."""
        if not any(_is_dtensor(t) for t in self.shadow.values()):
            return self
        gathered = object.__new__(EMA)
        gathered.decay, gathered.updates = self.decay, self.updates
        gathered.shadow = {n: _whole(t) for n, t in self.shadow.items()}
        return gathered

    def copy_to(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self.shadow[name])


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the tensor itself otherwise)."""
    return t.to_local() if _is_dtensor(t) else t  # type: ignore[attr-defined]


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor().cpu() if _is_dtensor(t) else t  # type: ignore[attr-defined]


def export_policy(policy: Any, out_dir: str | Path, source: str = "") -> Path:
    """Write ``policy.save_pretrained`` through ``cosmos_robot.manifest.staged_folder`` (staged, manifest, swap)."""
    from cosmos_robot.manifest import staged_folder
    from cosmos_robot.policies.registry import family_of

    out = Path(out_dir)
    info = {"source": source, "target": "policy"}
    with staged_folder(out, info) as tmp:  # the manifest is written from ``info`` after this block
        policy.save_pretrained(tmp)
        info["family"] = family_of(tmp).name
    return out
