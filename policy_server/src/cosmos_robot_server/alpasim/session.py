"""One AlpaSim rollout as the driver sees it: the latest frame per camera, the ego pose history, the
route; and the flat observation dict a ``BasePolicy`` gets from them. Proto-free on purpose, so the
conventions are testable without gRPC and the servicer stays a thin translation layer.

Observation keys (openpi style, see docs/alpasim.md):

- ``observation/<camera>``: uint8 (H, W, 3) RGB, the newest frame of each camera the policy uses;
- ``observation/state``: float32 (16,) = local->rig pose ``x, y, z, qw, qx, qy, qz`` and the rig-frame
  linear velocity, angular velocity and linear acceleration (3 each) at the anchor pose;
- ``observation/ego_history``: float32 (T, 3) past ``x, y, yaw`` in the current ego frame, oldest first;
- ``observation/route``: float32 (N, 3) route waypoints in the current ego frame;
- ``prompt`` (when configured) and ``observation/ground_truth`` (when enabled).
"""

from __future__ import annotations

import io
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_server.alpasim.config import AlpasimDriverConfig
from cosmos_robot_server.alpasim.geometry import quat_to_yaw, sample_history, to_ego_frame

__all__ = ["Anchor", "CameraInfo", "DriverError", "DriverSession", "decode_image"]

STATE_DIM = 16
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


class DriverError(Exception):
    """A request the driver refuses; ``code`` is a gRPC status name, the message names the field."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class CameraInfo:
    """A camera offered at ``start_session``; 0 means the size was not declared."""

    logical_id: str
    height: int = 0
    width: int = 0


@dataclass(frozen=True)
class Anchor:
    """The ego pose a plan is relative to: the newest pose at or before ``time_now_us``."""

    timestamp_us: int
    xyz: np.ndarray
    quat_wxyz: np.ndarray
    yaw: float


def decode_image(
    data: bytes,
    *,
    camera: CameraInfo | None,
    max_pixels: int,
    resize_to: tuple[int, int] | None = None,
) -> np.ndarray:
    """JPEG/PNG bytes -> uint8 (H, W, 3); the size is checked against the declared camera before decoding."""
    field_name = "camera_image.image_bytes"
    if not data:
        raise DriverError("INVALID_ARGUMENT", f"{field_name}: empty (is the renderer in skip mode?)")
    try:
        image = Image.open(io.BytesIO(data), formats=("JPEG", "PNG"))
    except UnidentifiedImageError:
        raise DriverError(
            "INVALID_ARGUMENT", f"{field_name}: not a JPEG or PNG image ({len(data)} bytes starting {data[:8]!r})"
        ) from None
    except _DECODE_ERRORS as exc:
        raise DriverError("INVALID_ARGUMENT", f"{field_name}: not a readable JPEG or PNG image ({exc})") from None
    width, height = image.size
    if camera is not None and camera.height and camera.width and (height, width) != (camera.height, camera.width):
        raise DriverError(
            "INVALID_ARGUMENT",
            f"{field_name}: image is {height}x{width} (HxW) but camera {camera.logical_id!r} was declared "
            f"{camera.height}x{camera.width} at start_session",
        )
    if width * height > max_pixels:
        raise DriverError("INVALID_ARGUMENT", f"{field_name}: {height}x{width} exceeds max_image_pixels={max_pixels}")
    try:
        rgb = image.convert("RGB")
        if resize_to is not None and (rgb.height, rgb.width) != resize_to:
            rgb = rgb.resize((resize_to[1], resize_to[0]), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.uint8).copy()
    except _DECODE_ERRORS as exc:
        raise DriverError("INVALID_ARGUMENT", f"{field_name}: cannot decode the {image.format} image ({exc})") from None


@dataclass
class DriverSession:
    """Mutable state of one rollout; callers hold ``lock`` around mutation and ``snapshot`` reads."""

    uuid: str
    random_seed: int
    scene_id: str | None
    cameras: dict[str, CameraInfo]  # offered at start_session (may be empty: then any id is accepted)
    required_cameras: tuple[str, ...] | None  # needed before drive; None = every camera heard from, at least one
    policy: BasePolicy
    owns_policy: bool  # made by a factory for this session: closed with it
    policy_lock: threading.Lock  # one infer at a time per policy object (shared by sessions of a shared policy)
    images: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)  # id -> (frame_end_us, HWC)
    poses: dict[int, np.ndarray] = field(default_factory=dict)  # timestamp_us -> (7 + 12,) pose + dynamics
    route: tuple[int, np.ndarray] | None = None  # (timestamp_us, (N, 3) rig frame at that time)
    ground_truth: tuple[int, np.ndarray] | None = None  # (timestamp_us, (M, 3) x, y, yaw in that rig frame)
    steps: int = 0
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def add_image(self, logical_id: str, frame_end_us: int, image: np.ndarray) -> None:
        previous = self.images.get(logical_id)
        if previous is None or frame_end_us >= previous[0]:
            self.images[logical_id] = (frame_end_us, image)

    def add_poses(self, timestamps_us: np.ndarray, poses: np.ndarray, dynamics: np.ndarray, keep: int) -> None:
        """``poses`` (N, 7) local->rig x, y, z, qw, qx, qy, qz; ``dynamics`` (N, 12) rig-frame rates."""
        for ts, pose, dyn in zip(timestamps_us.tolist(), poses, dynamics):
            self.poses[int(ts)] = np.concatenate([pose, dyn])
        if len(self.poses) > keep:
            for ts in sorted(self.poses)[: len(self.poses) - keep]:
                del self.poses[ts]

    def anchor(self, time_now_us: int) -> Anchor:
        if not self.poses:
            raise DriverError(
                "FAILED_PRECONDITION",
                f"session_uuid {self.uuid!r}: no ego pose yet; call submit_egomotion_observation before drive",
            )
        times = [ts for ts in self.poses if ts <= time_now_us]
        if not times:
            raise DriverError(
                "FAILED_PRECONDITION",
                f"time_now_us: {time_now_us} is before the first ego pose ({min(self.poses)}) of session {self.uuid!r}",
            )
        ts = max(times)
        row = self.poses[ts]
        return Anchor(ts, row[:3].copy(), row[3:7].copy(), float(quat_to_yaw(row[3:7])))

    def uses_camera(self, logical_id: str) -> bool:
        return self.required_cameras is None or logical_id in self.required_cameras

    def policy_cameras(self) -> tuple[str, ...]:
        """The cameras that go into the observation; raises when drive would come too early."""
        if self.required_cameras is None:
            if not self.images:
                raise DriverError(
                    "FAILED_PRECONDITION",
                    f"camera_image: no image received yet in session {self.uuid!r}; "
                    "call submit_image_observation before drive",
                )
            return tuple(sorted(self.images))
        missing = [cam for cam in self.required_cameras if cam not in self.images]
        if missing:
            raise DriverError(
                "FAILED_PRECONDITION",
                f"camera_image.logical_id: no image yet for {missing} in session {self.uuid!r}; "
                "call submit_image_observation for every camera before drive",
            )
        return self.required_cameras

    def observation(self, time_now_us: int, config: AlpasimDriverConfig) -> tuple[dict[str, Any], Anchor]:
        """The policy's input at ``time_now_us`` and the pose its plan will be anchored to."""
        cameras = self.policy_cameras()
        anchor = self.anchor(time_now_us)
        obs: dict[str, Any] = {}
        for cam in cameras:
            obs[config.camera_key(cam)] = self.images[cam][1]
        obs["observation/state"] = self.poses[anchor.timestamp_us][:STATE_DIM].astype(np.float32)
        ts = np.array(sorted(self.poses), dtype=np.int64)
        table = np.stack([self.poses[int(t)] for t in ts])
        obs["observation/ego_history"] = sample_history(
            ts,
            table[:, :3],
            quat_to_yaw(table[:, 3:7]),
            time_us=anchor.timestamp_us,
            anchor_xyz=anchor.xyz,
            anchor_yaw=anchor.yaw,
            length=config.history_length,
            dt_us=int(round(config.history_dt_s * 1e6)),
        ).astype(np.float32)
        obs["observation/route"] = self._route_in_ego(ts, table, anchor, config.route_length)
        if config.pass_ground_truth and self.ground_truth is not None:
            obs["observation/ground_truth"] = self.ground_truth[1].astype(np.float32)
        if config.prompt is not None:
            obs["prompt"] = config.prompt
        return obs, anchor

    def _route_in_ego(self, ts: np.ndarray, table: np.ndarray, anchor: Anchor, length: int | None) -> np.ndarray:
        points: np.ndarray = np.zeros((0, 3))
        if self.route is not None and len(self.route[1]):
            route_ts, route = self.route
            # the route is in the rig frame at its own timestamp: through local, into the anchor's rig frame
            x, y = (np.interp(route_ts, ts, table[:, k]) for k in (0, 1))
            yaw = float(np.interp(route_ts, ts, np.unwrap(quat_to_yaw(table[:, 3:7]))))
            cos, sin = np.cos(yaw), np.sin(yaw)
            local_xy = route[:, :2] @ np.array([[cos, -sin], [sin, cos]]).T + np.array([x, y])
            points = np.column_stack([to_ego_frame(local_xy, anchor.xyz, anchor.yaw), route[:, 2]])
        if length is not None:
            if len(points) >= length:
                points = points[:length]
            else:
                fill = points[-1] if len(points) else np.zeros(3)
                points = np.vstack([points, np.tile(fill, (length - len(points), 1))])
        return points.astype(np.float32)
