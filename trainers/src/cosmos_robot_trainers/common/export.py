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
    """Exponential moving average of the parameters, warmed up (decay ``min(d, (1 + n) / (10 + n))``)."""

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
        torch._foreach_lerp_([self.shadow[n] for n in names], [params[n].detach() for n in names], 1.0 - d)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        for name, value in state["shadow"].items():
            self.shadow[name].copy_(value)

    def copy_to(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self.shadow[name])


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
