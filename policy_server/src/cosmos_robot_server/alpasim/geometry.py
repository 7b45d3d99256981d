"""Planar pose math between AlpaSim's frames and a policy's ego frame: pure numpy, no gRPC.

AlpaSim's frames: ``local`` is a per-scene ENU frame; ``rig`` is body-fixed (x forward, y left, z up,
origin at the rear axle on the ground). Ego poses arrive as local->rig, i.e. the rig's position and
orientation in the local frame; the driver answers with planned local->rig poses.

Policies think in the ego (rig) frame, so the one convention that matters here is how an action chunk
becomes a trajectory (``plan_to_poses``): row k of ``actions`` (H, D) is the ego's planned position
(and optionally heading) in the rig frame *of the pose the plan is anchored to*, at time
``time_now_us + (k + 1) * dt_us``. Like AlpaSim's own drivers the mapping is planar: the plan keeps
the anchor's height, and roll/pitch are dropped (a yaw-only quaternion). Without a heading column the
heading of each row is the direction of travel from the previous row (from the origin for row 0),
held when the step is shorter than 0.1 mm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "PlanError",
    "PlannedPoses",
    "action_waypoints",
    "plan_to_poses",
    "quat_to_yaw",
    "sample_history",
    "to_ego_frame",
    "wrap_angle",
    "yaw_to_quat",
]

_MIN_STEP_M = 1e-4


class PlanError(ValueError):
    """The policy's actions cannot be read as a trajectory; the message names ``actions``."""


@dataclass(frozen=True)
class PlannedPoses:
    """A trajectory in the local frame: ``timestamps_us`` (N,), ``xyz`` (N, 3), ``quat_wxyz`` (N, 4)."""

    timestamps_us: np.ndarray
    xyz: np.ndarray
    quat_wxyz: np.ndarray


def wrap_angle(angle: np.ndarray | float) -> np.ndarray:
    """Map angles to [-pi, pi)."""
    return (np.asarray(angle, dtype=np.float64) + np.pi) % (2 * np.pi) - np.pi


def quat_to_yaw(quat_wxyz: np.ndarray) -> np.ndarray:
    """Yaw (rotation about z, ZYX convention) of scalar-first quaternions (..., 4); need not be normalised."""
    q = np.asarray(quat_wxyz, dtype=np.float64)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return np.arctan2(2.0 * (w * z + x * y), w * w + x * x - y * y - z * z)


def yaw_to_quat(yaw: np.ndarray | float) -> np.ndarray:
    """Scalar-first quaternions (..., 4) of pure rotations about z."""
    half = 0.5 * np.asarray(yaw, dtype=np.float64)
    zeros = np.zeros_like(half)
    return np.stack([np.cos(half), zeros, zeros, np.sin(half)], axis=-1)


def action_waypoints(actions: object, layout: str = "auto") -> np.ndarray:
    """Read an action chunk (H, D) as (H, 3) ego-frame ``x, y, yaw`` rows.

    ``layout``: ``"xy"`` uses columns 0-1 and derives the heading from the direction of travel;
    ``"xy_yaw"`` uses columns 0-2 (yaw in radians, relative to the anchor's heading); ``"auto"`` picks
    ``xy`` for D=2 and ``xy_yaw`` for D=3, reads ONE row of even width 2K > 3 as K flattened ``x, y``
    waypoints (``"flat_xy"``: a planner whose single chunk row is the whole plan, as the driving suite's
    are), and refuses other widths rather than guess. Extra columns are ignored under an explicit
    layout. A leading batch axis of size 1 is dropped.
    """
    try:
        arr = np.asarray(actions)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise PlanError(f"actions: not an array ({exc})") from None
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise PlanError(f"actions: expected an (H, D) array with H >= 1, got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise PlanError(f"actions: expected real numbers, got dtype {arr.dtype}")
    width = arr.shape[1]
    if layout == "auto" and arr.shape[0] == 1 and width > 3 and width % 2 == 0:
        layout = "flat_xy"
    if layout == "flat_xy":
        if arr.shape[0] != 1 or width % 2:
            raise PlanError(f"actions: layout 'flat_xy' needs one row of even width, got shape {tuple(arr.shape)}")
        arr = arr.reshape(width // 2, 2)
        layout, width = "xy", 2
    if layout == "auto":
        if width not in (2, 3):
            raise PlanError(
                f"actions: shape {tuple(arr.shape)} is not an (H, 2) x,y or (H, 3) x,y,yaw plan, nor one "
                "row of flattened x,y waypoints; "
                "set action_layout='xy' or 'xy_yaw' to use the leading columns of wider actions"
            )
        layout = "xy" if width == 2 else "xy_yaw"
    need = {"xy": 2, "xy_yaw": 3}.get(layout)
    if need is None:
        raise ValueError(f"layout: {layout!r} is not one of 'auto', 'xy', 'xy_yaw'")
    if width < need:
        raise PlanError(f"actions: layout {layout!r} needs D >= {need}, got shape {tuple(arr.shape)}")
    arr = arr[:, :need].astype(np.float64)
    if not np.isfinite(arr).all():
        row = int(np.argwhere(~np.isfinite(arr))[0][0])
        raise PlanError(f"actions: non-finite value in row {row}")
    if layout == "xy_yaw":
        return arr
    return np.column_stack([arr, _travel_heading(arr)])


def _travel_heading(xy: np.ndarray) -> np.ndarray:
    heading = np.zeros(len(xy))
    prev_xy, prev_heading = np.zeros(2), 0.0
    for k, point in enumerate(xy):
        step = point - prev_xy
        if np.hypot(step[0], step[1]) > _MIN_STEP_M:
            prev_heading = float(np.arctan2(step[1], step[0]))
        heading[k] = prev_heading
        prev_xy = point
    return heading


def plan_to_poses(
    actions: object,
    *,
    anchor_xyz: np.ndarray,
    anchor_yaw: float,
    time_now_us: int,
    dt_us: int,
    layout: str = "auto",
) -> PlannedPoses:
    """Turn an ego-frame action chunk into local-frame poses at ``time_now_us + (k + 1) * dt_us``.

    ``anchor_xyz``/``anchor_yaw`` are the local->rig pose the plan is relative to (the latest ego pose).
    """
    if dt_us < 1:
        raise ValueError(f"dt_us: must be >= 1, got {dt_us}")
    ego = action_waypoints(actions, layout)
    cos, sin = np.cos(anchor_yaw), np.sin(anchor_yaw)
    rotation = np.array([[cos, -sin], [sin, cos]])
    anchor = np.asarray(anchor_xyz, dtype=np.float64)
    xy = ego[:, :2] @ rotation.T + anchor[:2]
    xyz = np.column_stack([xy, np.full(len(ego), anchor[2])])
    yaw = wrap_angle(anchor_yaw + ego[:, 2])
    steps = np.arange(1, len(ego) + 1, dtype=np.int64)
    return PlannedPoses(
        timestamps_us=np.int64(time_now_us) + steps * np.int64(dt_us), xyz=xyz, quat_wxyz=yaw_to_quat(yaw)
    )


def to_ego_frame(xy: np.ndarray, anchor_xy: np.ndarray, anchor_yaw: float) -> np.ndarray:
    """Express local-frame points (N, 2) in the rig frame of the anchor pose."""
    cos, sin = np.cos(anchor_yaw), np.sin(anchor_yaw)
    rotation_t = np.array([[cos, sin], [-sin, cos]])  # R(anchor_yaw).T
    return (np.asarray(xy, dtype=np.float64) - np.asarray(anchor_xy, dtype=np.float64)[:2]) @ rotation_t.T


def sample_history(
    timestamps_us: np.ndarray,
    xyz: np.ndarray,
    yaw: np.ndarray,
    *,
    time_us: int,
    anchor_xyz: np.ndarray,
    anchor_yaw: float,
    length: int,
    dt_us: int,
) -> np.ndarray:
    """Past ego poses as (length, 3) ``x, y, yaw`` in the anchor's rig frame, oldest first.

    Row ``length - 1`` is at ``time_us``, row k at ``time_us - (length - 1 - k) * dt_us``; poses are
    interpolated linearly (yaw unwrapped) and held at the oldest known pose before the history starts.
    """
    ts = np.asarray(timestamps_us, dtype=np.float64)
    query = time_us - dt_us * np.arange(length - 1, -1, -1, dtype=np.float64)
    unwrapped = np.unwrap(np.asarray(yaw, dtype=np.float64))
    x = np.interp(query, ts, xyz[:, 0])
    y = np.interp(query, ts, xyz[:, 1])
    past_yaw = np.interp(query, ts, unwrapped)
    ego_xy = to_ego_frame(np.column_stack([x, y]), anchor_xyz, anchor_yaw)
    return np.column_stack([ego_xy, wrap_angle(past_yaw - anchor_yaw)])
