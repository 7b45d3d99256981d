"""A loopback AlpaSim runtime: the driving suite's episodes driven by a policy behind ``EgodriverService``.

Why: in AlpaGym the simulator (AlpaSim's runtime) is the gRPC *client*; every tick it pushes the ego's
motion, the route and the camera frames to the policy's driver service and asks it to ``drive``,
then tracks the returned trajectory. Running our suite the same way exercises the real contract end
to end (our ``cosmos_robot_server.alpasim`` driver, any ``BasePolicy`` behind it): an episode here is
what AlpaSim would produce with this policy, frames and timestamps as AlpaSim sends them.

Two transports, one code path: ``AlpasimLoopback.over_grpc(address)`` talks to a driver server over a
real channel; ``AlpasimLoopback.in_process(servicer)`` calls the same servicer's methods with the same
protobuf messages and no network, for speed. A test shows both give bitwise-equal trajectories.

Frames: highway-env's world (x along the road, y towards the right-hand lanes) becomes AlpaSim's
``local`` frame as (x, -y, 0) with yaw = -heading; the suite's ego frame IS AlpaSim's rig frame (x
forward, y left), so the env's ``route`` goes out as it is (rig-frame waypoints at the tick's
timestamp), and the returned poses become the suite's plan, point k at (k + 1) ticks, and are stepped.
The driver hands the policy the same ``ego_history`` and ``route`` the env observes (tested tick by tick).
"""

from __future__ import annotations

import io
import math
import uuid as uuid_lib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec

__all__ = ["AlpasimLoopback", "DriverCallError", "LoopbackEpisode", "RouteKeepingPolicy"]

TICK_US = 100_000  # 0.1 s: the suite's tick and AlpaSim's default control period
START_US = 1_000_000  # the first tick's timestamp (AlpaSim's clocks do not start at 0 either)
CAMERA_ID = "camera_top_down"  # the logical id the suite's camera is offered under


class DriverCallError(RuntimeError):
    """The driver refused a call (in-process: the status it would have sent over gRPC)."""

    def __init__(self, method: str, code: Any, details: str) -> None:
        super().__init__(f"{method}: {getattr(code, 'name', code)}: {details}")
        self.method, self.code, self.details = method, code, details


class _Context:
    """The part of ``grpc.ServicerContext`` the servicer uses: ``abort`` raises instead of sending."""

    def __init__(self, method: str) -> None:
        self.method = method

    def abort(self, code: Any, details: str) -> None:
        raise DriverCallError(self.method, code, details)


class _InProcess:
    """``servicer.method(request, context)`` as ``stub.method(request)``."""

    def __init__(self, servicer: Any) -> None:
        self._servicer = servicer

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._servicer, name)
        return lambda request: method(request, _Context(name))


@dataclass
class LoopbackEpisode:
    task: str
    seed: int
    plans: list[np.ndarray] = field(default_factory=list)  # ego-frame (K, 2) plans, one per tick
    positions: list[np.ndarray] = field(default_factory=list)  # the ego's world position after each tick
    infos: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False


def _world_to_local(x: float, y: float) -> tuple[float, float]:
    return x, -y


class AlpasimLoopback:
    """Runs ``DrivingEnv`` episodes with the policy behind an ``EgodriverService`` driver."""

    def __init__(self, driver: Any, *, camera: bool = False, channel: Any = None) -> None:
        self.driver, self.camera, self._channel = driver, camera, channel

    @classmethod
    def over_grpc(cls, address: str, *, camera: bool = False, timeout_s: float = 30.0) -> AlpasimLoopback:
        """A real gRPC channel to a driver server at ``address`` (``host:port``)."""
        import grpc

        from cosmos_robot_server.alpasim.proto import egodriver_pb2_grpc

        channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError as exc:
            channel.close()
            raise ConnectionError(f"no AlpaSim driver answers at {address} within {timeout_s} s") from exc
        return cls(egodriver_pb2_grpc.EgodriverServiceStub(channel), camera=camera, channel=channel)

    @classmethod
    def in_process(cls, servicer: Any, *, camera: bool = False) -> AlpasimLoopback:
        """The servicer's own methods, called with the same messages and no network."""
        return cls(_InProcess(servicer), camera=camera)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> AlpasimLoopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one episode -------------------------------------------------------------------------
    def run_episode(self, env: Any, *, seed: int, task: str, session_uuid: str | None = None) -> LoopbackEpisode:
        """Reset ``env`` (a ``DrivingEnv``; ``obs_mode="camera"`` when the runtime sends frames) to episode
        ``seed`` of ``task`` and drive it to its end with plans from the driver."""
        from cosmos_robot_server.alpasim.proto import egodriver_pb2

        sim = getattr(env, "unwrapped", env)
        if self.camera and sim.obs_mode != "camera":
            raise ValueError("AlpasimLoopback(camera=True) needs DrivingEnv(obs_mode='camera')")
        obs, info = sim.reset(seed=seed, options={"task": task})
        uuid = session_uuid or uuid_lib.uuid4().hex
        self.driver.start_session(self._session_request(uuid, seed, obs))
        episode = LoopbackEpisode(task=task, seed=seed)
        try:
            now = START_US
            self.driver.submit_egomotion_observation(self._egomotion(uuid, sim, now))
            while True:
                self.driver.submit_route(self._route(uuid, obs, now))
                if self.camera:
                    self.driver.submit_image_observation(self._image(uuid, obs["image"], now))
                reply = self.driver.drive(egodriver_pb2.DriveRequest(session_uuid=uuid, time_now_us=now))
                plan = self._plan(reply, sim, now)
                obs, reward, terminated, truncated, info = sim.step(plan)
                now += TICK_US
                episode.plans.append(plan)
                episode.positions.append(np.array(sim.ego.position, np.float64))
                episode.infos.append(info)
                episode.reward += float(reward)
                if terminated or truncated or reply.terminate_session:
                    episode.terminated = bool(terminated)
                    break
                self.driver.submit_egomotion_observation(self._egomotion(uuid, sim, now))
        finally:
            self.driver.close_session(egodriver_pb2.DriveSessionCloseRequest(session_uuid=uuid))
        return episode

    # -- messages ----------------------------------------------------------------------------
    def _session_request(self, uuid: str, seed: int, obs: dict[str, Any]) -> Any:
        from cosmos_robot_server.alpasim.proto import egodriver_pb2, sensorsim_pb2

        request = egodriver_pb2.DriveSessionRequest(session_uuid=uuid, random_seed=seed)
        if self.camera:
            h, w = obs["image"].shape[:2]
            camera = sensorsim_pb2.AvailableCamerasReturn.AvailableCamera(logical_id=CAMERA_ID)
            camera.intrinsics.resolution_h, camera.intrinsics.resolution_w = h, w
            request.rollout_spec.vehicle.available_cameras.append(camera)
        return request

    @staticmethod
    def _egomotion(uuid: str, sim: Any, now: int) -> Any:
        """The ego's pose at ``now`` (local frame) and its rig-frame velocity."""
        from cosmos_robot_server.alpasim.geometry import yaw_to_quat
        from cosmos_robot_server.alpasim.proto import common_pb2, egodriver_pb2

        ego = sim.ego
        x, y = _world_to_local(float(ego.position[0]), float(ego.position[1]))
        yaw = -float(ego.heading)
        w, qx, qy, qz = (float(v) for v in yaw_to_quat(yaw))
        vx, vy = float(ego.velocity[0]), -float(ego.velocity[1])  # local frame
        c, s = math.cos(yaw), math.sin(yaw)
        pose = common_pb2.PoseAtTime(
            timestamp_us=now,
            pose=common_pb2.Pose(vec=common_pb2.Vec3(x=x, y=y, z=0.0), quat=common_pb2.Quat(w=w, x=qx, y=qy, z=qz)),
        )
        state = common_pb2.DynamicState(linear_velocity=common_pb2.Vec3(x=c * vx + s * vy, y=-s * vx + c * vy, z=0.0))
        message = egodriver_pb2.RolloutEgoTrajectory(session_uuid=uuid, dynamic_states=[state])
        message.trajectory.poses.append(pose)
        return message

    @staticmethod
    def _route(uuid: str, obs: dict[str, Any], now: int) -> Any:
        from cosmos_robot_server.alpasim.proto import common_pb2, egodriver_pb2

        route = np.asarray(obs["route"], np.float64)  # (N, 3) rig frame, as the suite observes it
        waypoints = [common_pb2.Vec3(x=float(px), y=float(py), z=float(pz)) for px, py, pz in route]
        return egodriver_pb2.RouteRequest(
            session_uuid=uuid, route=egodriver_pb2.Route(timestamp_us=now, waypoints=waypoints)
        )

    @staticmethod
    def _image(uuid: str, image: np.ndarray, now: int) -> Any:
        from PIL import Image

        from cosmos_robot_server.alpasim.proto import egodriver_pb2

        buf = io.BytesIO()
        Image.fromarray(np.asarray(image, np.uint8)).save(buf, format="PNG")
        frame = egodriver_pb2.RolloutCameraImage.CameraImage(
            frame_start_us=now - TICK_US // 2, frame_end_us=now, image_bytes=buf.getvalue(), logical_id=CAMERA_ID
        )
        return egodriver_pb2.RolloutCameraImage(session_uuid=uuid, camera_image=frame)

    @staticmethod
    def _plan(reply: Any, sim: Any, now: int) -> np.ndarray:
        """The returned local-frame poses as the suite's (K, 2) rig-frame plan: positions at now + k
        ticks (k = 1..K), interpolated in time from the poses' own timestamps (a driver whose
        ``action_dt`` differs from the tick still gives the path it means), the last step continued."""
        stamps = np.array([p.timestamp_us for p in reply.trajectory.poses], np.float64)
        later = stamps > now
        if not later.any():
            raise DriverCallError("drive", "INTERNAL", "the driver returned no pose after time_now_us")
        ego = sim.ego
        ax, ay = _world_to_local(float(ego.position[0]), float(ego.position[1]))
        yaw = -float(ego.heading)
        c, s = math.cos(yaw), math.sin(yaw)
        local = np.array([[p.pose.vec.x, p.pose.vec.y] for p in reply.trajectory.poses], np.float64)[later]
        local -= np.array([ax, ay])
        rig = np.column_stack([c * local[:, 0] + s * local[:, 1], -s * local[:, 0] + c * local[:, 1]])
        times = np.concatenate([[float(now)], stamps[later]])  # the plan starts at the ego (origin, now)
        path = np.vstack([[0.0, 0.0], rig])
        query = now + TICK_US * np.arange(1, sim.plan_len + 1, dtype=np.float64)
        out = np.column_stack([np.interp(query, times, path[:, k]) for k in (0, 1)])
        beyond = query > times[-1]
        if beyond.any():  # continue the last step at its speed
            velocity = (path[-1] - path[-2]) / max(times[-1] - times[-2], 1.0)
            out[beyond] = path[-1] + np.outer(query[beyond] - times[-1], velocity)
        return out.astype(np.float32)  # rig frame: the suite's plan


class RouteKeepingPolicy(BasePolicy):
    """A driver-side baseline on AlpaSim's observation (``observation/route``, ``observation/state``):
    the route's waypoints followed at the current speed (``target_speed`` when given). No other agents
    reach an AlpaSim driver except through cameras, so this keeps its lane and does not brake."""

    def __init__(self, plan_len: int = 20, dt_s: float = 0.1, target_speed: float | None = None) -> None:
        self.plan_len, self.dt_s, self.target_speed = plan_len, dt_s, target_speed

    @property
    def input_spec(self) -> InputSpec:
        return InputSpec(
            {
                "observation/route": ArraySpec((None, 3), "floating"),
                "observation/state": ArraySpec((16,), "floating"),
            },
            allow_extra=True,
        )

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        route = np.asarray(obs["observation/route"], np.float64)[:, :2]
        speed = float(np.asarray(obs["observation/state"])[7]) if self.target_speed is None else self.target_speed
        path = np.vstack([[0.0, 0.0], route])
        arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(path, axis=0), axis=1))])
        travel = max(speed, 0.0) * self.dt_s * np.arange(1, self.plan_len + 1)
        beyond = travel - arc[-1]
        x = np.where(beyond > 0, path[-1, 0] + beyond, np.interp(travel, arc, path[:, 0]))
        y = np.interp(travel, arc, path[:, 1])
        return {"actions": np.column_stack([x, y]).astype(np.float32)}
