"""Policy action conventions <-> LIBERO's 7-D OSC_POSE command, both ways, exactly.

LIBERO's controller takes, each control step, ``[dpos(3), drot(3), gripper]`` in [-1, 1]: a
frame-wise delta of the end effector (position, and orientation as an axis-angle vector) and a
gripper command (-1 opens, +1 closes). Policies are trained in other layouts:

- **openpi** (pi0 / pi0.5 LIBERO checkpoints, and LeRobot's): the same 7 numbers, the model's output
  padded to its action width (32 for pi0.5); ``LiberoOutputs`` keeps the first 7.
  :class:`OpenpiLiberoActions`.
- **cosmos-framework** (Cosmos Policy LIBERO checkpoints): frame-wise relative deltas with the
  rotation as 6-D (the first two columns of the rotation matrix; 10-D rows), 3-D (axis-angle;
  7-D) or 9-D (the whole matrix, row-major; 13-D), the gripper ``g`` in [0, 1] (``zero_one``: the
  command is ``1 - 2g``), optionally quantile-normalised to [-1, 1] with the stats file's q01/q99
  (rotation dims pass through). :class:`CosmosFrameworkLiberoActions`. Decoding a 6-D rotation
  completes the third column by a cross product and projects onto SO(3) by SVD, as
  cosmos-framework does.

``to_env`` maps model rows to commands; ``from_env`` maps recorded commands (a LIBERO dataset's
actions) to model rows, for training. They invert each other (tests check both directions to
1e-9): rotation vectors are returned with angles in [0, pi], the only range the controller's
deltas use. NumPy only (no torch, no scipy, no simulator): it lives in the client package so a
robot computer, the LIBERO env side and the cosmos3 policy all share one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "CosmosFrameworkLiberoActions",
    "OpenpiLiberoActions",
    "axis_angle_to_matrix",
    "matrix_to_axis_angle",
    "matrix_to_rot6d",
    "rot6d_to_matrix",
]

ENV_DIM = 7
_ROT_WIDTH = {"3d": 3, "6d": 6, "9d": 9}
GRIPPER_MODES = ("zero_one", "pm_one", "pm_one_flip")


# --- rotations ------------------------------------------------------------------------------------
def axis_angle_to_matrix(v: np.ndarray) -> np.ndarray:
    """(..., 3) axis * angle -> (..., 3, 3) (Rodrigues)."""
    v = np.asarray(v, dtype=np.float64)
    angle = np.linalg.norm(v, axis=-1)
    safe = np.where(angle > 1e-12, angle, 1.0)
    k = v / safe[..., None]
    kx, ky, kz = k[..., 0], k[..., 1], k[..., 2]
    zero = np.zeros_like(kx)
    skew = np.stack([zero, -kz, ky, kz, zero, -kx, -ky, kx, zero], axis=-1).reshape(*v.shape[:-1], 3, 3)
    s, c = np.sin(angle)[..., None, None], np.cos(angle)[..., None, None]
    eye = np.broadcast_to(np.eye(3), skew.shape)
    out = eye + s * skew + (1.0 - c) * (skew @ skew)
    return np.where((angle > 1e-12)[..., None, None], out, eye)


def _matrix_to_quat_wxyz(m: np.ndarray) -> np.ndarray:
    """Shepperd's method: pick the largest of w, x, y, z to divide by (stable near 180 degrees)."""
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    trace = m00 + m11 + m22
    cands = np.stack([1.0 + trace, 1.0 + m00 - m11 - m22, 1.0 - m00 + m11 - m22, 1.0 - m00 - m11 + m22], axis=-1)
    best = np.argmax(cands, axis=-1)
    r = np.sqrt(np.maximum(np.take_along_axis(cands, best[..., None], axis=-1)[..., 0], 1e-300)) * 2.0
    d = {  # (w, x, y, z) times r, for each choice of the largest component
        0: (r * r / 4, m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]),
        1: (m[..., 2, 1] - m[..., 1, 2], r * r / 4, m[..., 0, 1] + m[..., 1, 0], m[..., 0, 2] + m[..., 2, 0]),
        2: (m[..., 0, 2] - m[..., 2, 0], m[..., 0, 1] + m[..., 1, 0], r * r / 4, m[..., 1, 2] + m[..., 2, 1]),
        3: (m[..., 1, 0] - m[..., 0, 1], m[..., 0, 2] + m[..., 2, 0], m[..., 1, 2] + m[..., 2, 1], r * r / 4),
    }
    q = np.zeros((*m.shape[:-2], 4))
    for choice, parts in d.items():
        sel = best == choice
        q[sel] = (np.stack(parts, axis=-1) / r[..., None])[sel]
    q *= np.where(q[..., 0] < 0, -1.0, 1.0)[..., None]  # w >= 0: angle in [0, pi]
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def matrix_to_axis_angle(m: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotation matrices -> (..., 3) axis * angle with the angle in [0, pi]."""
    q = _matrix_to_quat_wxyz(np.asarray(m, dtype=np.float64))
    sin_half = np.linalg.norm(q[..., 1:], axis=-1)
    angle = 2.0 * np.arctan2(sin_half, q[..., 0])
    scale = np.where(sin_half > 1e-12, angle / np.where(sin_half > 1e-12, sin_half, 1.0), 2.0)
    return q[..., 1:] * scale[..., None]


def rot6d_to_matrix(r6: np.ndarray) -> np.ndarray:
    """(..., 6) ``[R00, R10, R20, R01, R11, R21]`` -> (..., 3, 3): third column = c0 x c1, then the
    nearest rotation by SVD (determinant fixed to +1), as cosmos-framework decodes it."""
    r6 = np.asarray(r6, dtype=np.float64)
    c0, c1 = r6[..., 0:3], r6[..., 3:6]
    m = np.stack([c0, c1, np.cross(c0, c1)], axis=-1)
    return _project_so3(m)


def _project_so3(m: np.ndarray) -> np.ndarray:
    u, _, vt = np.linalg.svd(m)
    det = np.linalg.det(u @ vt)
    u[..., :, 2] *= np.where(det < 0, -1.0, 1.0)[..., None]
    out: np.ndarray = u @ vt
    return out


def matrix_to_rot6d(m: np.ndarray) -> np.ndarray:
    """(..., 3, 3) -> (..., 6), the first two columns."""
    m = np.asarray(m, dtype=np.float64)
    return np.concatenate([m[..., :, 0], m[..., :, 1]], axis=-1)


# --- conventions ----------------------------------------------------------------------------------
def _rows(x: np.ndarray, width: int | None, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or (width is not None and a.shape[1] != width):
        want = f"(H, {width})" if width is not None else "(H, D)"
        raise ValueError(f"{what}: expected shape {want}, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what}: expected finite values")
    return a


@dataclass(frozen=True)
class OpenpiLiberoActions:
    """openpi's LIBERO layout: the first 7 of the model's ``model_dim`` action dims are the command."""

    model_dim: int = 7

    def __post_init__(self) -> None:
        if self.model_dim < ENV_DIM:
            raise ValueError(f"model_dim: expected >= {ENV_DIM}, got {self.model_dim}")

    def to_env(self, rows: np.ndarray) -> np.ndarray:
        a = _rows(rows, None, "actions")
        if a.shape[1] < ENV_DIM:
            raise ValueError(f"actions: expected at least {ENV_DIM} dims per row, got shape {a.shape}")
        return a[:, :ENV_DIM].astype(np.float32)

    def from_env(self, commands: np.ndarray) -> np.ndarray:
        c = _rows(commands, ENV_DIM, "commands")
        out = np.zeros((c.shape[0], self.model_dim), dtype=np.float32)
        out[:, :ENV_DIM] = c
        return out


@dataclass(frozen=True)
class CosmosFrameworkLiberoActions:
    """cosmos-framework's frame-wise relative LIBERO actions ``[dpos(3), rot(3|6|9), g]``.

    ``q01`` / ``q99``: the stats file's ``global_raw`` quantiles (one per action dim; rotation dims
    are not normalised), or None for raw rows. ``gripper``: ``zero_one`` (g in [0, 1], command
    ``1 - 2g``), ``pm_one`` (g is the command) or ``pm_one_flip`` (command ``-g``).
    """

    rotation: str = "6d"
    q01: np.ndarray | None = field(default=None, compare=False)
    q99: np.ndarray | None = field(default=None, compare=False)
    gripper: str = "zero_one"

    def __post_init__(self) -> None:
        if self.rotation not in _ROT_WIDTH:
            raise ValueError(f"rotation: expected one of {sorted(_ROT_WIDTH)}, got {self.rotation!r}")
        if self.gripper not in GRIPPER_MODES:
            raise ValueError(f"gripper: expected one of {GRIPPER_MODES}, got {self.gripper!r}")
        if (self.q01 is None) != (self.q99 is None):
            raise ValueError("q01 and q99: pass both quantile vectors or neither")
        for name in ("q01", "q99"):
            value = getattr(self, name)
            if value is not None and np.asarray(value).shape != (self.width,):
                raise ValueError(f"{name}: expected shape ({self.width},), got {np.asarray(value).shape}")

    @classmethod
    def for_width(cls, width: int, **kwargs: object) -> CosmosFrameworkLiberoActions:
        """cosmos-framework's ``rotation_space=auto``: 7 -> 3d, 10 -> 6d, 13 -> 9d."""
        by_width = {3 + w + 1: name for name, w in _ROT_WIDTH.items()}
        if width not in by_width:
            raise ValueError(f"action width {width}: expected 7 (3d), 10 (6d) or 13 (9d)")
        return cls(rotation=by_width[width], **kwargs)  # type: ignore[arg-type]

    @property
    def width(self) -> int:
        return 3 + _ROT_WIDTH[self.rotation] + 1

    def _scaled_dims(self) -> np.ndarray:
        dims = np.ones(self.width, dtype=bool)
        dims[3 : 3 + _ROT_WIDTH[self.rotation]] = False  # rotation passes through (quantile_rot)
        return dims

    def _span(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.q01 is not None and self.q99 is not None
        lo, hi = np.asarray(self.q01, np.float64), np.asarray(self.q99, np.float64)
        return lo, np.maximum(hi - lo, 1e-6)

    def to_env(self, rows: np.ndarray) -> np.ndarray:
        """(H, width) model rows -> (H, 7) LIBERO commands."""
        x = _rows(rows, self.width, "actions").copy()
        if self.q01 is not None:
            lo, span = self._span()
            dims = self._scaled_dims()
            x[:, dims] = (x[:, dims] + 1.0) / 2.0 * span[dims] + lo[dims]
        rot = x[:, 3 : 3 + _ROT_WIDTH[self.rotation]]
        if self.rotation == "3d":
            rotvec = rot
        elif self.rotation == "6d":
            rotvec = matrix_to_axis_angle(rot6d_to_matrix(rot))
        else:
            rotvec = matrix_to_axis_angle(_project_so3(rot.reshape(-1, 3, 3)))
        g = x[:, -1]
        command = {"zero_one": 1.0 - 2.0 * g, "pm_one": g, "pm_one_flip": -g}[self.gripper]
        out = np.concatenate([x[:, :3], rotvec, np.clip(command, -1.0, 1.0)[:, None]], axis=1)
        return out.astype(np.float32)

    def from_env(self, commands: np.ndarray) -> np.ndarray:
        """(H, 7) LIBERO commands -> (H, width) model rows (float64, for training targets)."""
        c = _rows(commands, ENV_DIM, "commands")
        if self.rotation == "3d":
            rot = matrix_to_axis_angle(axis_angle_to_matrix(c[:, 3:6]))
        elif self.rotation == "6d":
            rot = matrix_to_rot6d(axis_angle_to_matrix(c[:, 3:6]))
        else:
            rot = axis_angle_to_matrix(c[:, 3:6]).reshape(-1, 9)
        cmd = c[:, 6]
        g = {"zero_one": (1.0 - cmd) / 2.0, "pm_one": cmd, "pm_one_flip": -cmd}[self.gripper]
        x = np.concatenate([c[:, :3], rot, g[:, None]], axis=1)
        if self.q01 is not None:
            lo, span = self._span()
            dims = self._scaled_dims()
            x[:, dims] = (x[:, dims] - lo[dims]) / span[dims] * 2.0 - 1.0
        return x
