"""cosmos-framework's policy conventions for Cosmos3 checkpoints: DROID (joint positions) and LIBERO.

What turns a robot observation into the model's inputs and its output rows back into commands:

- ``droid`` (Cosmos3-Nano/Edge-Policy-DROID, RoboLab / RoboArena / openpi DROID clients): the wrist
  view on top, the two exterior views at half size side by side below, resized to 540x640 (aspect
  ignored; RoboLab's cosmos3 client sends that canvas already composed, and it is only resized);
  the state row ``[q(7), 1 - g]``; chunk 32, 4 UniPC steps, guidance 3, shift 5, fps 15,
  tier 480, domain 8; outputs ``[q(7), g]`` with the gripper flipped back (1 = closed), raw units;
- ``libero``: third-person | wrist side by side (256x512), no state row; chunk 16, 30 steps,
  guidance 1, shift 3 (tier 256), fps 20, domain 5; outputs 10-D frame-wise ``[dpos(3), rot6d(6), g]``
  de-normalised from the stats file's ``global_raw`` q01/q99 (rot6d passes through), then converted
  to LIBERO's 7-D command ``[dpos(3), axis-angle(3), g]``.

Per-checkpoint overrides (``cosmos_robot_policy.json``'s ``settings``) change any sampling field,
e.g. the Edge checkpoint's guidance interval ``[960, 1001]``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cosmos_robot.policies.cosmos3.sampler import SampleSettings
from cosmos_robot_client.libero_actions import (
    CosmosFrameworkLiberoActions,
    axis_angle_to_matrix,
    matrix_to_axis_angle,
    matrix_to_rot6d,
    rot6d_to_matrix,
)

__all__ = [
    "DROID",
    "EMBODIMENTS",
    "DROID_CANVAS_HW",
    "LIBERO",
    "Embodiment",
    "axis_angle_to_matrix",
    "droid_canvas",
    "droid_composite",
    "libero_composite",
    "matrix_to_axis_angle",
    "matrix_to_rot6d",
    "rot6d_to_matrix",
]

DROID_CANVAS_HW = (540, 640)  # cosmos-framework's RoboLab server: --image-height 540 --image-width 640
# cosmos-framework's RoboLab server appends this to the prompt's framing for the composite view
CONCAT_VIEW_DESCRIPTION = (
    "The top row is from the wrist-mounted camera. The bottom row contains two horizontally concatenated "
    "third-person perspective views of the scene from opposite sides, with the robot visible."
)


@dataclass(frozen=True)
class Embodiment:
    name: str
    settings: SampleSettings
    uses_state: bool
    action_dim: int  # what the policy returns per row
    action_space: str


DROID = Embodiment(
    name="droid",
    settings=SampleSettings(
        chunk=32,
        num_steps=4,
        guidance=3.0,
        shift=5.0,
        domain_id=8,
        raw_dim=8,
        fps=15.0,
        resolution_tier=480,
        view_point="concat_view",
        view_description=CONCAT_VIEW_DESCRIPTION,
    ),
    uses_state=True,
    action_dim=8,
    action_space="joint_position",
)
LIBERO = Embodiment(
    name="libero",
    settings=SampleSettings(
        chunk=16,
        num_steps=30,
        guidance=1.0,
        shift=3.0,
        domain_id=5,
        raw_dim=10,
        fps=20.0,
        resolution_tier=256,
        view_point="concat_view",
    ),
    uses_state=False,
    action_dim=7,
    action_space="eef_delta_axis_angle",
)
EMBODIMENTS = {"droid": DROID, "libero": LIBERO}
SETTING_FIELDS = frozenset(SampleSettings.__dataclass_fields__)


def with_overrides(emb: Embodiment, overrides: dict[str, Any], where: str) -> Embodiment:
    """``emb`` with some sampling fields replaced (each checked by name)."""
    unknown = sorted(set(overrides) - SETTING_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown settings {unknown} (known: {sorted(SETTING_FIELDS)})")
    values = dict(overrides)
    if values.get("guidance_interval") is not None:
        lo, hi = values["guidance_interval"]
        values["guidance_interval"] = (float(lo), float(hi))
    return replace(emb, settings=replace(emb.settings, **values))


# --- images ---------------------------------------------------------------------------------------
def _chw(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float()


def droid_canvas(image: np.ndarray, out_hw: tuple[int, int] = DROID_CANVAS_HW) -> np.ndarray:
    """A client-composed canvas (RoboLab's ``observation/image``) resized to ``out_hw``, aspect ignored
    as cosmos-framework's RoboLab server does; returned unchanged when it already has that size."""
    img = np.asarray(image)
    if img.shape[:2] == tuple(out_hw):
        return np.ascontiguousarray(img)
    out = F.interpolate(_chw(img), size=out_hw, mode="bilinear", align_corners=False)
    return out[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def droid_composite(
    wrist: np.ndarray, ext1: np.ndarray, ext2: np.ndarray, out_hw: tuple[int, int] = DROID_CANVAS_HW
) -> np.ndarray:
    """Wrist view on top, both exteriors at half size side by side below, resized to ``out_hw``."""
    w = _chw(wrist)
    h, wd = w.shape[-2:]
    e1 = F.interpolate(_chw(ext1), size=(h // 2, wd // 2), mode="bilinear", align_corners=False)
    e2 = F.interpolate(_chw(ext2), size=(h // 2, wd - wd // 2), mode="bilinear", align_corners=False)
    comp = torch.cat([w, torch.cat([e1, e2], dim=-1)], dim=-2)
    comp = F.interpolate(comp, size=out_hw, mode="bilinear", align_corners=False)
    return comp[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def libero_composite(third: np.ndarray, wrist: np.ndarray, side: int = 256) -> np.ndarray:
    """Third-person | wrist, each resized to ``side`` x ``side`` (256x512 for cosmos-framework's LIBERO)."""
    a = F.interpolate(_chw(third), size=(side, side), mode="bilinear", align_corners=False)
    b = F.interpolate(_chw(wrist), size=(side, side), mode="bilinear", align_corners=False)
    return torch.cat([a, b], dim=-1)[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


# --- the LIBERO 10-D action: numpy conversions shared with the env side -----------------------------
def libero_command(rows: np.ndarray, q01: np.ndarray, q99: np.ndarray) -> np.ndarray:
    """(H, 10) model rows -> (H, 7) LIBERO OSC command ``[dpos(3), drotvec(3), gripper]``.

    cosmos-framework's ``quantile_rot`` de-normalisation ``(x + 1) / 2 (q99 - q01) + q01`` of the
    translation and gripper (rot6d dims pass through), rot6d -> rotation vector, and its ``zero_one``
    gripper: g in [0, 1] becomes ``1 - 2g`` (+1 opens, -1 closes). See
    :class:`cosmos_robot_client.libero_actions.CosmosFrameworkLiberoActions`.
    """
    conv = CosmosFrameworkLiberoActions("6d", q01=np.asarray(q01, np.float64), q99=np.asarray(q99, np.float64))
    return conv.to_env(rows)
