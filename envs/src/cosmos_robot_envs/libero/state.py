"""LIBERO's 8-D policy state: ``[eef_pos(3), axis_angle(eef_quat)(3), gripper_qpos(2)]``.

The convention of openpi's and LeRobot's LIBERO training data. robosuite reports quaternions as
``(x, y, z, w)``; the axis-angle vector is ``axis * angle`` with ``angle = 2 acos(w)`` in
``[0, 2 pi]`` (not wrapped to ``[0, pi]``: the datasets were made that way, and a policy trained on
them expects the same numbers).
"""

from __future__ import annotations

import numpy as np

__all__ = ["libero_state", "quat_xyzw_to_axis_angle"]


def quat_xyzw_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """(..., 4) unit quaternions ``(x, y, z, w)`` -> (..., 3) axis * angle; zero for the identity."""
    q = np.asarray(quat, dtype=np.float64)
    w = np.clip(q[..., 3], -1.0, 1.0)
    den = np.sqrt(1.0 - w * w)
    angle = 2.0 * np.arccos(w)
    scale = np.where(den > 1e-10, angle / np.where(den > 1e-10, den, 1.0), 0.0)
    return q[..., :3] * scale[..., None]


def libero_state(eef_pos: np.ndarray, eef_quat: np.ndarray, gripper_qpos: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [np.asarray(eef_pos, np.float64), quat_xyzw_to_axis_angle(eef_quat), np.asarray(gripper_qpos, np.float64)]
    ).astype(np.float32)
