"""AlpaSim's ``egodriver.EgodriverService`` around any ``BasePolicy``: the simulator pushes frames, ego
poses and the route, then calls ``drive`` and gets the policy's plan back as timestamped poses.

A thin translation layer: protos become numpy here, the rollout state and the observation layout live
in ``session.py``, the action -> trajectory convention in ``geometry.py``. Every refusal is a gRPC
status whose message names the field (INVALID_ARGUMENT: malformed data; NOT_FOUND: unknown session;
FAILED_PRECONDITION: wrong call order or a policy/observation mismatch; INTERNAL: the policy returned
something unusable; UNAVAILABLE: the policy's backend is unreachable), and no request can take the
server down. Nothing is unpickled: images are decoded by Pillow (JPEG/PNG only), ``renderer_data`` is
ignored, and ``DriveResponse.debug_info`` stays empty (AlpaSim's own drivers pickle into it).

The policy is either one shared object (``reset()`` at every ``start_session``; fine for stateless
policies and for one rollout at a time) or a zero-argument factory called once per session (each
rollout gets its own policy, e.g. its own websocket connection to a cosmos-robot policy server, which
then batches the concurrent rollouts on the GPU side); factory-made policies are ``close()``d with
their session.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.spec import ObservationError
from cosmos_robot_server.alpasim.config import AlpasimDriverConfig
from cosmos_robot_server.alpasim.geometry import PlanError, plan_to_poses, quat_to_yaw
from cosmos_robot_server.alpasim.session import CameraInfo, DriverError, DriverSession, decode_image

INSTALL_HINT = 'the AlpaSim driver needs grpcio and protobuf: pip install "cosmos-robot-server[alpasim]"'
try:
    import grpc

    from cosmos_robot_server.alpasim.proto import common_pb2, egodriver_pb2, egodriver_pb2_grpc
except ImportError as _exc:  # pragma: no cover - exercised in the environment without the extra
    raise ImportError(f"{INSTALL_HINT} ({_exc})") from _exc

__all__ = ["INSTALL_HINT", "AlpasimDriverServicer", "PolicyOrFactory"]

log = logging.getLogger(__name__)
PolicyOrFactory = Union[BasePolicy, Callable[[], BasePolicy]]
_R = TypeVar("_R")


def _rpc(method: Callable[[Any, Any, Any], _R]) -> Callable[[Any, Any, Any], _R]:
    """Turn ``DriverError`` (and anything unexpected) into a gRPC status instead of a dead handler."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: Any) -> _R:
        try:
            return method(self, request, context)
        except DriverError as exc:
            error = exc
        except Exception as exc:  # a bug must cost one request, not the server
            log.exception("alpasim %s failed", method.__name__)
            error = DriverError("INTERNAL", f"{method.__name__}: {type(exc).__name__}: {exc}")
        log.warning("alpasim %s refused (%s): %s", method.__name__, error.code, error.message)
        context.abort(getattr(grpc.StatusCode, error.code), error.message)
        raise AssertionError("context.abort returned")  # it raises; keeps type checkers honest

    return wrapper


def _is_policy(obj: object) -> bool:
    if isinstance(obj, type):  # a class is a factory of policies, not a policy
        return False
    return isinstance(obj, BasePolicy) or callable(getattr(obj, "infer", None))


def _policy_failure(what: str, exc: Exception) -> DriverError:
    unreachable = isinstance(exc, (ConnectionError, TimeoutError))
    code = "UNAVAILABLE" if unreachable else "INTERNAL"
    return DriverError(code, f"{what} raised {type(exc).__name__}: {exc}")


def _close_policy(policy: BasePolicy) -> None:
    close = getattr(policy, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # closing a dead connection must not fail close_session
            log.warning("alpasim: closing %s failed", type(policy).__name__, exc_info=True)


class AlpasimDriverServicer(egodriver_pb2_grpc.EgodriverServiceServicer):
    """The service object; ``AlpasimDriverServer`` (or ``serve_alpasim``) runs it on a port."""

    def __init__(self, policy: PolicyOrFactory, config: AlpasimDriverConfig | None = None) -> None:
        self.config = config or AlpasimDriverConfig()
        if _is_policy(policy):
            self._shared: BasePolicy | None = policy  # type: ignore[assignment]
            self._factory: Callable[[], BasePolicy] | None = None
            name = type(policy).__name__
        elif callable(policy):
            self._shared, self._factory = None, policy
            name = getattr(policy, "__name__", type(policy).__name__)
        else:
            raise TypeError(f"policy: expected a BasePolicy or a factory of one, got {type(policy).__name__}")
        self.policy_name = name
        self._shared_lock = threading.Lock()
        self._sessions: dict[str, DriverSession] = {}
        self._lock = threading.Lock()

    # -- session bookkeeping -------------------------------------------------------------------
    @property
    def session_ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def _get(self, session_uuid: str) -> DriverSession:
        if not session_uuid:
            raise DriverError("INVALID_ARGUMENT", "session_uuid: empty")
        with self._lock:
            session = self._sessions.get(session_uuid)
        if session is None:
            raise DriverError(
                "NOT_FOUND", f"session_uuid: unknown session {session_uuid!r} (never started, or already closed)"
            )
        session.touch()
        return session

    def _drop_idle(self) -> None:
        timeout = self.config.session_idle_timeout_s
        if timeout is None:
            return
        now = time.monotonic()
        with self._lock:
            idle = [s for s in self._sessions.values() if now - s.last_used > timeout]
            for session in idle:
                del self._sessions[session.uuid]
        for session in idle:
            log.warning("alpasim: dropping session %s, idle for more than %.0f s", session.uuid, timeout)
            if session.owns_policy:
                _close_policy(session.policy)

    def close_all(self, timeout_s: float = 5.0) -> None:
        """Forget every session and close their policies; a policy stuck in ``infer`` is left behind."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        owned = [s.policy for s in sessions if s.owns_policy]

        def close_owned() -> None:
            for policy in owned:
                _close_policy(policy)

        if owned:
            closer = threading.Thread(target=close_owned, name="alpasim-close", daemon=True)
            closer.start()
            closer.join(timeout_s)

    def _cameras(self, request: Any) -> dict[str, CameraInfo]:
        cameras: dict[str, CameraInfo] = {}
        for i, cam in enumerate(request.rollout_spec.vehicle.available_cameras):
            where = f"rollout_spec.vehicle.available_cameras[{i}]"
            logical_id = cam.logical_id or cam.intrinsics.logical_id
            if not logical_id:
                raise DriverError("INVALID_ARGUMENT", f"{where}.logical_id: empty")
            if logical_id in cameras:
                raise DriverError("INVALID_ARGUMENT", f"{where}.logical_id: {logical_id!r} is listed twice")
            cameras[logical_id] = CameraInfo(logical_id, cam.intrinsics.resolution_h, cam.intrinsics.resolution_w)
        return cameras

    # -- RPCs ----------------------------------------------------------------------------------
    @_rpc
    def get_version(self, request: Any, context: Any) -> Any:
        from cosmos_robot_server import __version__

        major, minor, patch = self.config.api_version
        return common_pb2.VersionId(
            version_id=f"cosmos-robot-server-{__version__}/{self.policy_name}",
            git_hash="unknown",
            grpc_api_version=common_pb2.VersionId.APIVersion(major=major, minor=minor, patch=patch),
        )

    @_rpc
    def start_session(self, request: Any, context: Any) -> Any:
        uuid = request.session_uuid
        if not uuid:
            raise DriverError("INVALID_ARGUMENT", "session_uuid: empty")
        self._drop_idle()
        cameras = self._cameras(request)
        wanted = self.config.cameras
        if wanted is not None and cameras:
            missing = [c for c in wanted if c not in cameras]
            if missing:
                raise DriverError(
                    "FAILED_PRECONDITION",
                    f"rollout_spec.vehicle.available_cameras: the policy needs {missing}, "
                    f"the session offers {sorted(cameras)}",
                )
        required = wanted if wanted is not None else (tuple(cameras) or None)
        with self._lock:
            self._check_admission(uuid)
        policy, owns, lock = self._session_policy()
        try:
            with lock:
                policy.reset()
        except Exception as exc:  # noqa: BLE001 - reported to the simulator below
            if owns:
                _close_policy(policy)
            raise _policy_failure("policy.reset()", exc) from None
        session = DriverSession(
            uuid=uuid,
            random_seed=request.random_seed,
            scene_id=request.debug_info.scene_id if request.HasField("debug_info") else None,
            cameras=cameras,
            required_cameras=required,
            policy=policy,
            owns_policy=owns,
            policy_lock=lock,
        )
        with self._lock:
            try:
                self._check_admission(uuid)  # again: a concurrent start may have won meanwhile
            except DriverError:
                if owns:
                    _close_policy(policy)
                raise
            self._sessions[uuid] = session
            active = len(self._sessions)
        if self._factory is None and active > 1:
            log.warning(
                "alpasim: %d concurrent sessions share one policy object; use a factory if it keeps state", active
            )
        log.info("alpasim: session %s started (scene %s, cameras %s)", uuid, session.scene_id, required)
        return common_pb2.SessionRequestStatus()

    def _check_admission(self, uuid: str) -> None:
        if uuid in self._sessions:
            raise DriverError("ALREADY_EXISTS", f"session_uuid: session {uuid!r} is already running")
        if len(self._sessions) >= self.config.max_sessions:
            raise DriverError(
                "RESOURCE_EXHAUSTED", f"session_uuid: {len(self._sessions)} sessions running (max_sessions)"
            )

    def _session_policy(self) -> tuple[BasePolicy, bool, threading.Lock]:
        if self._factory is None:
            assert self._shared is not None
            return self._shared, False, self._shared_lock
        try:
            policy = self._factory()
        except Exception as exc:  # noqa: BLE001 - e.g. the policy server is not up
            raise _policy_failure("the policy factory", exc) from None
        if not _is_policy(policy):
            raise DriverError("INTERNAL", f"the policy factory returned {type(policy).__name__}, not a policy")
        return policy, True, threading.Lock()

    @_rpc
    def close_session(self, request: Any, context: Any) -> Any:
        session = self._get(request.session_uuid)
        with self._lock:
            self._sessions.pop(session.uuid, None)
        if session.owns_policy:
            _close_policy(session.policy)
        log.info("alpasim: session %s closed after %d drive calls", session.uuid, session.steps)
        return common_pb2.Empty()

    @_rpc
    def submit_image_observation(self, request: Any, context: Any) -> Any:
        session = self._get(request.session_uuid)
        if not request.HasField("camera_image"):
            raise DriverError("INVALID_ARGUMENT", "camera_image: missing")
        image = request.camera_image
        if not image.logical_id:
            raise DriverError("INVALID_ARGUMENT", "camera_image.logical_id: empty")
        if session.cameras and image.logical_id not in session.cameras:
            raise DriverError(
                "INVALID_ARGUMENT",
                f"camera_image.logical_id: {image.logical_id!r} was not offered at start_session "
                f"(offered: {sorted(session.cameras)})",
            )
        if not session.uses_camera(image.logical_id):
            return common_pb2.Empty()  # offered but not used by this policy: not even decoded
        pixels = decode_image(
            image.image_bytes,
            camera=session.cameras.get(image.logical_id),
            max_pixels=self.config.max_image_pixels,
            resize_to=self.config.image_size,
        )
        with session.lock:
            session.add_image(image.logical_id, image.frame_end_us, pixels)
        return common_pb2.Empty()

    @_rpc
    def submit_egomotion_observation(self, request: Any, context: Any) -> Any:
        session = self._get(request.session_uuid)
        poses = request.trajectory.poses
        if not poses:
            raise DriverError("INVALID_ARGUMENT", "trajectory.poses: empty")
        states = request.dynamic_states
        if len(states) not in (0, len(poses)):
            raise DriverError(
                "INVALID_ARGUMENT",
                f"dynamic_states: {len(states)} entries for {len(poses)} poses (expected one per pose, or none)",
            )
        stamps = np.array([p.timestamp_us for p in poses], dtype=np.int64)
        table = _finite_table([[*_vec(p.pose.vec), *_quat(p.pose.quat)] for p in poses], 7, "trajectory.poses")
        norms = np.linalg.norm(table[:, 3:7], axis=1)
        if (norms < 1e-6).any():
            i = int(np.argmax(norms < 1e-6))
            raise DriverError("INVALID_ARGUMENT", f"trajectory.poses[{i}].pose.quat: zero quaternion (left unset?)")
        table[:, 3:7] /= norms[:, None]
        dynamics: np.ndarray = np.zeros((len(poses), 12))
        if len(states):
            rows = [
                [*_vec(s.linear_velocity), *_vec(s.angular_velocity), *_vec(s.linear_acceleration)]
                + [*_vec(s.angular_acceleration)]
                for s in states
            ]
            dynamics = _finite_table(rows, 12, "dynamic_states")
        with session.lock:
            session.add_poses(stamps, table, dynamics, keep=self.config.max_pose_history)
        return common_pb2.Empty()

    @_rpc
    def submit_route(self, request: Any, context: Any) -> Any:
        session = self._get(request.session_uuid)
        points = _finite_table([_vec(w) for w in request.route.waypoints], 3, "route.waypoints")
        with session.lock:
            session.route = (int(request.route.timestamp_us), points)
        return common_pb2.Empty()

    @_rpc
    def submit_recording_ground_truth(self, request: Any, context: Any) -> Any:
        session = self._get(request.session_uuid)
        rows = [[p.pose.vec.x, p.pose.vec.y, *_quat(p.pose.quat)] for p in request.ground_truth.trajectory.poses]
        table = _finite_table(rows, 6, "ground_truth.trajectory.poses")
        path = np.column_stack([table[:, :2], quat_to_yaw(table[:, 2:6])])
        with session.lock:
            session.ground_truth = (int(request.ground_truth.timestamp_us), path)
        return common_pb2.Empty()

    @_rpc
    def drive(self, request: Any, context: Any) -> Any:
        session = self._get(request.session_uuid)
        time_now_us = int(request.time_now_us)
        with session.lock:
            obs, anchor = session.observation(time_now_us, self.config)
            session.steps += 1
        spec = session.policy.input_spec
        if spec is not None:
            if not spec.allow_extra:  # the driver offers all of AlpaSim's keys; a strict policy gets the ones it names
                obs = {k: v for k, v in obs.items() if k in spec.fields}
            try:
                spec.validate(obs)
            except ObservationError as exc:
                raise DriverError(
                    "FAILED_PRECONDITION",
                    f"the policy's input_spec refuses the driver's observation: {exc} "
                    "(see camera_map, image_size, route_length and prompt in AlpasimDriverConfig)",
                ) from None
        try:
            with session.policy_lock:
                result = session.policy.infer(obs)
        except Exception as exc:  # noqa: BLE001 - reported to the simulator
            raise _policy_failure("policy.infer", exc) from None
        if not isinstance(result, Mapping) or "actions" not in result:
            got = sorted(map(str, result)) if isinstance(result, Mapping) else type(result).__name__
            raise DriverError("INTERNAL", f"actions: the policy's result has no 'actions' (got {got})")
        try:
            plan = plan_to_poses(
                result["actions"],
                anchor_xyz=anchor.xyz,
                anchor_yaw=anchor.yaw,
                time_now_us=time_now_us,
                dt_us=self.config.action_dt_us,
                layout=self.config.action_layout,
            )
        except PlanError as exc:
            raise DriverError("INTERNAL", str(exc)) from None
        trajectory = common_pb2.Trajectory()
        if self.config.include_current_pose:
            trajectory.poses.append(_pose_at(anchor.timestamp_us, anchor.xyz, anchor.quat_wxyz))
        for ts, xyz, quat in zip(plan.timestamps_us.tolist(), plan.xyz, plan.quat_wxyz):
            trajectory.poses.append(_pose_at(ts, xyz, quat))
        terminate = bool(np.asarray(result.get("terminate_session", False)).any())
        return egodriver_pb2.DriveResponse(trajectory=trajectory, terminate_session=terminate)


def _vec(v: Any) -> list[float]:
    return [v.x, v.y, v.z]


def _quat(q: Any) -> list[float]:
    return [q.w, q.x, q.y, q.z]


def _finite_table(rows: list[list[float]], width: int, field_name: str) -> np.ndarray:
    """``rows`` as a float64 ``(N, width)`` table; a NaN or infinity is the client's error, named by row."""
    table = np.array(rows, dtype=np.float64).reshape(-1, width)
    bad = ~np.isfinite(table)
    if bad.any():
        raise DriverError("INVALID_ARGUMENT", f"{field_name}[{int(np.argwhere(bad)[0][0])}]: non-finite value")
    return table


def _pose_at(timestamp_us: int, xyz: np.ndarray, quat_wxyz: np.ndarray) -> Any:
    x, y, z = (float(v) for v in xyz)
    w, qx, qy, qz = (float(v) for v in quat_wxyz)
    return common_pb2.PoseAtTime(
        pose=common_pb2.Pose(vec=common_pb2.Vec3(x=x, y=y, z=z), quat=common_pb2.Quat(w=w, x=qx, y=qy, z=qz)),
        timestamp_us=int(timestamp_us),
    )
