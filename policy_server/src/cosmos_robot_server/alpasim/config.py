"""Settings of the AlpaSim driver service, validated on construction (errors name the field).

They describe the two conventions that a driving policy and the simulator must agree on and that the
wire cannot carry: how an observation is laid out for the policy (camera keys, history and route
lengths) and how the policy's ``actions`` become a trajectory (column layout, time step).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ACTION_LAYOUTS", "AlpasimDriverConfig"]

ACTION_LAYOUTS = ("auto", "xy", "xy_yaw", "flat_xy")


@dataclass
class AlpasimDriverConfig:
    # -- observation -> policy --------------------------------------------------------------------
    cameras: tuple[str, ...] | None = None  # logical camera ids the policy uses; None = all offered by the session
    camera_map: Mapping[str, str] = field(default_factory=dict)  # logical id -> key suffix (observation/<suffix>)
    image_size: tuple[int, int] | None = None  # (H, W) to resize every camera to; None = as rendered
    history_length: int = 16  # rows of observation/ego_history (past poses, newest last)
    history_dt_s: float = 0.1  # seconds between ego_history rows
    route_length: int | None = None  # pad/truncate observation/route to this many waypoints; None = as sent
    prompt: str | None = None  # sent as "prompt" with every observation when set
    pass_ground_truth: bool = False  # add observation/ground_truth (the recorded path: an oracle, off by default)
    # -- policy actions -> trajectory ---------------------------------------------------------------
    # columns of actions: "xy", "xy_yaw", "flat_xy" (one row x0, y0, x1, ...), or "auto" (D=2 -> xy, D=3 ->
    # xy_yaw, one row of even width > 3 -> flat_xy)
    action_layout: str = "auto"
    action_dt_s: float = 0.1  # seconds between consecutive action rows (row k is at time_now + (k+1) * dt)
    include_current_pose: bool = True  # start the trajectory with the ego pose the plan is anchored to
    # -- service ----------------------------------------------------------------------------------
    max_sessions: int = 64  # concurrent rollouts; more start_session calls get RESOURCE_EXHAUSTED
    session_idle_timeout_s: float | None = 600.0  # drop sessions untouched this long (a crashed simulator)
    max_message_bytes: int = 64 * 1024 * 1024  # largest gRPC request accepted (a PNG frame is a few MB)
    max_image_pixels: int = 16_000_000  # refuse larger images before decoding them (decompression bombs)
    max_pose_history: int = 2000  # ego poses kept per session (older ones are dropped)
    api_version: tuple[int, int, int] = (0, 54, 0)  # alpasim_grpc release reported by get_version

    def __post_init__(self) -> None:
        if self.cameras is not None:
            self.cameras = tuple(self.cameras)
            if len(set(self.cameras)) != len(self.cameras) or any(not c for c in self.cameras):
                raise ValueError(f"AlpasimDriverConfig.cameras: expected distinct non-empty ids, got {self.cameras}")
        self.camera_map = dict(self.camera_map)
        keys = [self.camera_map.get(c, c) for c in self.cameras or ()]
        if len(set(keys)) != len(keys):
            raise ValueError(f"AlpasimDriverConfig.camera_map: two cameras map to one key ({keys})")
        if self.image_size is not None:
            self.image_size = (int(self.image_size[0]), int(self.image_size[1]))
            if min(self.image_size) < 1:
                raise ValueError(f"AlpasimDriverConfig.image_size: expected (H, W) >= 1, got {self.image_size}")
        if self.history_length < 1:
            raise ValueError(f"AlpasimDriverConfig.history_length: must be >= 1, got {self.history_length}")
        if self.route_length is not None and self.route_length < 1:
            raise ValueError(f"AlpasimDriverConfig.route_length: must be >= 1 or None, got {self.route_length}")
        if self.action_layout not in ACTION_LAYOUTS:
            raise ValueError(f"AlpasimDriverConfig.action_layout: {self.action_layout!r}; choose from {ACTION_LAYOUTS}")
        for name in ("history_dt_s", "action_dt_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"AlpasimDriverConfig.{name}: must be > 0, got {getattr(self, name)}")
        if round(self.action_dt_s * 1e6) < 1:
            raise ValueError(f"AlpasimDriverConfig.action_dt_s: below one microsecond ({self.action_dt_s})")
        for name in ("max_sessions", "max_image_pixels", "max_pose_history"):
            if getattr(self, name) < 1:
                raise ValueError(f"AlpasimDriverConfig.{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"AlpasimDriverConfig.max_message_bytes: must be >= 1024, got {self.max_message_bytes}")
        if self.session_idle_timeout_s is not None and self.session_idle_timeout_s <= 0:
            raise ValueError(
                f"AlpasimDriverConfig.session_idle_timeout_s: must be > 0 or None, got {self.session_idle_timeout_s}"
            )

    @property
    def action_dt_us(self) -> int:
        return int(round(self.action_dt_s * 1e6))

    def camera_key(self, logical_id: str) -> str:
        """The observation key of one camera: ``observation/<camera_map.get(id, id)>``."""
        return f"observation/{self.camera_map.get(logical_id, logical_id)}"
