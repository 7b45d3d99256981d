"""The AlpaSim driver service, driven over loopback gRPC with the generated stubs like AlpaSim's runtime.

AlpaSim itself (Docker, GPUs, gated scenes) cannot run here; what can be pinned is checked instead:
the wire bytes against messages encoded by code generated from upstream's own .proto files
(``UPSTREAM``), a full session against a deterministic policy, every refusal's status code and the
field its message names, and that the committed generated modules match our .proto files.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec
from cosmos_robot_server.alpasim import AlpasimDriverConfig, PlanError, plan_to_poses
from cosmos_robot_server.alpasim.geometry import quat_to_yaw, sample_history, yaw_to_quat
from cosmos_robot_server.alpasim.launcher import StraightPolicy, build_parser, config_from_args
from cosmos_robot_server.alpasim.session import CameraInfo, DriverError, decode_image
from tests.helpers import run_python

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "policy_server" / "src" / "cosmos_robot_server" / "alpasim" / "proto"
WIDE, TELE = "camera_front_wide_120fov", "camera_front_tele_30fov"
T0 = 1_000_000  # sim time of the first step, microseconds
DT = 100_000

# Serialized by modules generated (grpcio-tools 1.64.1) from NVlabs/alpasim@3032e0c
# src/grpc/alpasim_grpc/v0/{common,sensorsim,egodriver}.proto; the messages are built in test_upstream_bytes.
UPSTREAM = {
    "start_session": "0a06676f6c64656e110700000000000000220a0a08636c697067742d312a88010a85011a82010a51122f090000000000"
    "0018401100000000000010401801221000000000000000007b14ae47e17a843f31333333333333f33f2a1863616d6572615f66726f6e745f"
    "776964655f313230666f763808400c480112130a0a0d0000c03f1d0000a03f12050d0000803f1a1863616d6572615f66726f6e745f776964"
    "655f313230666f76",
    "egomotion": "0a06676f6c64656e1a2a0a280a1d0a0f0d00002041150000a0411d0000003f120a0df304353f25f304353f1140420f"
    "00000000002a150a051d0000803e12050d0000a0401a050d0000003f",
    "route": "0a06676f6c64656e1a1c0a050d000020410a0a0d0000a04115000000401140420f0000000000",
    "drive": "0a06676f6c64656e1940420f000000000021e0c81000000000002a020102",
    "response": "122a0a280a1d0a0f0d00002041150000a0411d0000003f120a0df304353f25f304353f11e0c81000000000002001",
}


def _encoded(h: int, w: int, fmt: str = "PNG", value: int = 100) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), value, dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


# -- pure conventions (no gRPC needed) ------------------------------------------------------------
def test_plan_xy_rotates_into_local_and_heads_along_travel() -> None:
    plan = plan_to_poses(
        [[1.0, 0.0], [2.0, 0.0], [2.0, 1.0], [2.0, 1.0]],
        anchor_xyz=np.array([10.0, 20.0, 0.5]),
        anchor_yaw=np.pi / 2,
        time_now_us=T0,
        dt_us=DT,
    )
    np.testing.assert_array_equal(plan.timestamps_us, T0 + DT * np.arange(1, 5))
    np.testing.assert_allclose(plan.xyz, [[10, 21, 0.5], [10, 22, 0.5], [9, 22, 0.5], [9, 22, 0.5]], atol=1e-12)
    # travel headings in the ego frame: 0, 0, +90 deg, held (no motion); plus the anchor's 90 deg
    np.testing.assert_allclose(quat_to_yaw(plan.quat_wxyz), [np.pi / 2, np.pi / 2, -np.pi, -np.pi], atol=1e-12)


def test_plan_xy_yaw_and_layouts() -> None:
    plan = plan_to_poses([[1.0, 0.0, 0.5]], anchor_xyz=np.zeros(3), anchor_yaw=3.0, time_now_us=0, dt_us=250_000)
    assert plan.timestamps_us.tolist() == [250_000]
    np.testing.assert_allclose(quat_to_yaw(plan.quat_wxyz), [3.5 - 2 * np.pi])  # wrapped to [-pi, pi)
    wide = np.arange(14, dtype=np.float32).reshape(2, 7)
    with pytest.raises(PlanError, match=r"actions: shape \(2, 7\)"):
        plan_to_poses(wide, anchor_xyz=np.zeros(3), anchor_yaw=0.0, time_now_us=0, dt_us=1)
    xy = plan_to_poses(wide, anchor_xyz=np.zeros(3), anchor_yaw=0.0, time_now_us=0, dt_us=1, layout="xy")
    np.testing.assert_allclose(xy.xyz[:, :2], wide[:, :2])
    batched = plan_to_poses(wide[None, :, :3], anchor_xyz=np.zeros(3), anchor_yaw=0.0, time_now_us=0, dt_us=1)
    np.testing.assert_allclose(quat_to_yaw(batched.quat_wxyz), [2.0, 9.0 - 2 * np.pi], atol=1e-6)
    # one row holding a whole plan (the driving suite's planners: actions (1, 2K)) is K x, y waypoints
    flat = np.array([[1.0, 0.0, 2.0, 0.5, 3.0, 1.0, 4.0, 1.5]])
    for layout in ("auto", "flat_xy"):
        poses = plan_to_poses(flat, anchor_xyz=np.zeros(3), anchor_yaw=0.0, time_now_us=0, dt_us=1, layout=layout)
        np.testing.assert_allclose(poses.xyz[:, :2], flat.reshape(4, 2))
    with pytest.raises(PlanError, match=r"layout 'flat_xy' needs one row of even width, got shape \(2, 7\)"):
        plan_to_poses(wide, anchor_xyz=np.zeros(3), anchor_yaw=0.0, time_now_us=0, dt_us=1, layout="flat_xy")
    for bad, message in [
        ([[0.0, np.nan]], "non-finite value in row 0"),
        (np.zeros((0, 2)), "H >= 1"),
        (np.zeros(3), "got shape"),
        ([[1.0], [2.0, 3.0]], "not an array"),
        (np.array([["a", "b"]]), "real numbers"),
    ]:
        with pytest.raises(PlanError, match=message):
            plan_to_poses(bad, anchor_xyz=np.zeros(3), anchor_yaw=0.0, time_now_us=0, dt_us=1)


def test_yaw_quat_round_trip_and_history() -> None:
    yaws = np.array([-3.0, -1.0, 0.0, 0.5, 3.0])
    np.testing.assert_allclose(quat_to_yaw(yaw_to_quat(yaws) * 2.0), yaws)  # unnormalised input is fine
    # driving north (yaw 90 deg) at 10 m/s: history in the ego frame lies behind the car on its x axis
    ts = T0 + DT * np.arange(5)
    xyz = np.column_stack([np.zeros(5), np.arange(5.0), np.zeros(5)])
    hist = sample_history(
        ts,
        xyz,
        np.full(5, np.pi / 2),
        time_us=int(ts[-1]),
        anchor_xyz=xyz[-1],
        anchor_yaw=np.pi / 2,
        length=7,
        dt_us=DT,
    )
    np.testing.assert_allclose(hist[:, 0], [-4, -4, -4, -3, -2, -1, 0], atol=1e-9)  # held before the first pose
    np.testing.assert_allclose(hist[:, 1:], 0.0, atol=1e-9)


def test_decode_image_checks_format_size_and_limits() -> None:
    cam = CameraInfo(WIDE, 8, 12)
    out = decode_image(_encoded(8, 12, "JPEG"), camera=cam, max_pixels=1000)
    assert out.shape == (8, 12, 3) and out.dtype == np.uint8
    resized = decode_image(_encoded(8, 12), camera=cam, max_pixels=1000, resize_to=(4, 6))
    assert resized.shape == (4, 6, 3) and int(resized[0, 0, 0]) == 100
    gif = io.BytesIO()
    Image.new("RGB", (12, 8)).save(gif, format="GIF")
    cases: list[tuple[bytes, CameraInfo | None, str]] = [
        (_encoded(6, 12), cam, "image is 6x12 .* declared 8x12"),
        (b"not an image", cam, "not a JPEG or PNG image \\(12 bytes"),
        (gif.getvalue(), cam, "not a JPEG or PNG"),
        (_encoded(8, 12)[:50], cam, "cannot decode"),
        (_encoded(8, 12, "JPEG")[:200], cam, "not a readable JPEG"),
        (b"", cam, "empty"),
        (_encoded(40, 40), None, "exceeds max_image_pixels"),
    ]
    for data, camera, message in cases:
        with pytest.raises(DriverError, match=message) as info:
            decode_image(data, camera=camera, max_pixels=1000)
        assert info.value.code == "INVALID_ARGUMENT" and "camera_image.image_bytes" in info.value.message


def test_config_errors_name_the_field() -> None:
    for kwargs, name in [
        ({"action_layout": "xyz"}, "action_layout"),
        ({"action_dt_s": 0}, "action_dt_s"),
        ({"cameras": (WIDE, WIDE)}, "cameras"),
        ({"cameras": (WIDE, TELE), "camera_map": {WIDE: "image", TELE: "image"}}, "camera_map"),
        ({"history_length": 0}, "history_length"),
        ({"image_size": (0, 4)}, "image_size"),
    ]:
        with pytest.raises(ValueError, match=f"AlpasimDriverConfig.{name}"):
            AlpasimDriverConfig(**kwargs)  # type: ignore[arg-type]


def test_launcher_parses_and_documents_itself() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["--policy", "straight", "--camera", WIDE, "--camera-map", f"{WIDE}=image", "--image-size", "224x224"]
    )
    config = config_from_args(args)
    assert config.cameras == (WIDE,) and config.camera_key(WIDE) == "observation/image"
    assert config.image_size == (224, 224)
    assert StraightPolicy(5.0, horizon=3).infer({})["actions"][:, 0].tolist() == pytest.approx([0.5, 1.0, 1.5])
    assert "python -m cosmos_robot_server.alpasim --policy ws://" in parser.format_help()


def test_package_imports_without_grpc() -> None:
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "import cosmos_robot_server, cosmos_robot_server.alpasim as a, cosmos_robot_server.alpasim.launcher\n"
        "a.AlpasimDriverConfig()\n"
        "try:\n    a.serve_alpasim\nexcept ImportError as e:\n    print(e)\n"
    )
    res = run_python(sys.executable, code)
    assert res.returncode == 0, res.stderr
    assert 'pip install "cosmos-robot-server[alpasim]"' in res.stdout


# -- the service over loopback gRPC ---------------------------------------------------------------
class RecordingPolicy(BasePolicy):
    """Plans ``[[k+1, 0.1*(k+1)*step]]``-style rows so each drive is distinguishable; records its inputs."""

    def __init__(self, horizon: int = 5, width: int = 2, spec: InputSpec | None = None) -> None:
        self.horizon, self.width, self._spec = horizon, width, spec
        self.seen: list[dict[str, Any]] = []
        self.resets = 0
        self.closed = False
        self.result: dict[str, Any] | None = None  # overrides the answer when set
        self.error: Exception | None = None

    @property
    def input_spec(self) -> InputSpec | None:
        return self._spec

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(obs)
        if self.error is not None:
            raise self.error
        if self.result is not None:
            return self.result
        k = np.arange(1, self.horizon + 1, dtype=np.float32)
        cols = [k, 0.1 * len(self.seen) * k, np.zeros_like(k)][: self.width]
        return {"actions": np.column_stack(cols)}

    def reset(self) -> None:
        self.resets += 1

    def close(self) -> None:
        self.closed = True


class Driver:
    """A running server plus a client stub; ``call(name, msg)`` returns the reply or the RpcError."""

    def __init__(self, pb: Any, policy: Any, config: AlpasimDriverConfig | None = None) -> None:
        import grpc

        from cosmos_robot_server.alpasim import AlpasimDriverServer

        self.pb, self.grpc = pb, grpc
        self.server = AlpasimDriverServer(policy, port=0, config=config, max_workers=4)
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = pb.grpc_mod.EgodriverServiceStub(self.channel)

    def call(self, name: str, message: Any) -> Any:
        try:
            return getattr(self.stub, name)(message, timeout=5)
        except self.grpc.RpcError as exc:
            return exc

    def refused(self, name: str, message: Any, code: str, field: str) -> None:
        err = self.call(name, message)
        assert isinstance(err, self.grpc.RpcError), f"{name} was accepted, expected {code}"
        assert err.code() == getattr(self.grpc.StatusCode, code), (err.code(), err.details())
        assert field in err.details(), err.details()

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace_s=None)

    # message builders
    def start(self, uuid: str, cameras: tuple[tuple[str, int, int], ...] = ((WIDE, 8, 12), (TELE, 4, 6))) -> Any:
        ego, sensorsim = self.pb.ego, self.pb.sensorsim
        offered = [
            sensorsim.AvailableCamerasReturn.AvailableCamera(
                logical_id=cid, intrinsics=sensorsim.CameraSpec(logical_id=cid, resolution_h=h, resolution_w=w)
            )
            for cid, h, w in cameras
        ]
        spec = ego.DriveSessionRequest.RolloutSpec(
            vehicle=ego.DriveSessionRequest.RolloutSpec.VehicleDefinition(available_cameras=offered)
        )
        return ego.DriveSessionRequest(session_uuid=uuid, random_seed=3, rollout_spec=spec)

    def image(self, uuid: str, cam: str, data: bytes, t: int = T0) -> Any:
        camera = self.pb.ego.RolloutCameraImage.CameraImage(
            logical_id=cam, image_bytes=data, frame_start_us=t - 1000, frame_end_us=t
        )
        return self.pb.ego.RolloutCameraImage(session_uuid=uuid, camera_image=camera)

    def ego(self, uuid: str, poses: list[tuple[int, float, float, float]], speed: float = 10.0) -> Any:
        """``poses``: (timestamp_us, x, y, yaw) in the local frame."""
        c = self.pb.common
        traj = c.Trajectory()
        for t, x, y, yaw in poses:
            w, _, _, z = yaw_to_quat(yaw).tolist()
            traj.poses.append(
                c.PoseAtTime(pose=c.Pose(vec=c.Vec3(x=x, y=y, z=0.5), quat=c.Quat(w=w, z=z)), timestamp_us=t)
            )
        states = [c.DynamicState(linear_velocity=c.Vec3(x=speed), angular_velocity=c.Vec3(z=0.1)) for _ in poses]
        return self.pb.ego.RolloutEgoTrajectory(session_uuid=uuid, trajectory=traj, dynamic_states=states)

    def route(self, uuid: str, points: list[tuple[float, float, float]], t: int = T0) -> Any:
        waypoints = [self.pb.common.Vec3(x=x, y=y, z=z) for x, y, z in points]
        return self.pb.ego.RouteRequest(session_uuid=uuid, route=self.pb.ego.Route(timestamp_us=t, waypoints=waypoints))

    def drive(self, uuid: str, t: int = T0) -> Any:
        return self.pb.ego.DriveRequest(session_uuid=uuid, time_now_us=t, time_query_us=t + DT)

    def ready(self, uuid: str, t: int = T0) -> None:
        """A session with every observation in place, ego at (0, 0) heading north."""
        assert not isinstance(self.call("start_session", self.start(uuid)), self.grpc.RpcError)
        for cam, (h, w) in ((WIDE, (8, 12)), (TELE, (4, 6))):
            assert not isinstance(
                self.call("submit_image_observation", self.image(uuid, cam, _encoded(h, w), t)), Exception
            )
        assert not isinstance(
            self.call("submit_egomotion_observation", self.ego(uuid, [(t, 0, 0, np.pi / 2)])), Exception
        )


@pytest.fixture
def driver(pb: Any) -> Iterator[tuple[Driver, RecordingPolicy]]:
    policy = RecordingPolicy()
    d = Driver(pb, policy, AlpasimDriverConfig(history_length=4, route_length=3, prompt="follow the route"))
    yield d, policy
    d.close()


def test_full_session(driver: tuple[Driver, RecordingPolicy]) -> None:
    d, policy = driver
    version = d.call("get_version", d.pb.common.Empty())
    assert version.version_id.endswith("/RecordingPolicy") and version.grpc_api_version.minor == 54
    assert not isinstance(d.call("start_session", d.start("s1")), Exception) and policy.resets == 1
    # warm-up history: heading north (yaw 90 deg) at 10 m/s, one pose per 100 ms
    history = [(T0 + DT * k, 0.0, 1.0 * k, np.pi / 2) for k in range(3)]
    d.call("submit_egomotion_observation", d.ego("s1", history))
    d.call("submit_route", d.route("s1", [(5.0, 0.0, 0.0), (10.0, 1.0, 0.0)], t=T0 + 2 * DT))
    for step in range(3):
        now = T0 + DT * (2 + step)
        if step:
            d.call("submit_egomotion_observation", d.ego("s1", [(now, 0.0, 2.0 + step, np.pi / 2)]))
        for cam, (h, w) in ((WIDE, (8, 12)), (TELE, (4, 6))):
            fmt = "JPEG" if cam == WIDE else "PNG"
            assert not isinstance(
                d.call("submit_image_observation", d.image("s1", cam, _encoded(h, w, fmt), now)), Exception
            )
        reply = d.call("drive", d.drive("s1", now))
        assert not isinstance(reply, Exception), reply
        poses = reply.trajectory.poses
        assert len(poses) == 1 + policy.horizon and not reply.terminate_session
        assert [p.timestamp_us for p in poses] == [now] + [now + DT * k for k in range(1, 6)]
        xy = np.array([[p.pose.vec.x, p.pose.vec.y] for p in poses])
        ego_y = 0.1 * (step + 1) * np.arange(1, 6)  # the policy's lateral column (to the left)
        np.testing.assert_allclose(xy[0], [0.0, 2.0 + step], atol=1e-6)  # the anchor pose
        np.testing.assert_allclose(xy[1:], np.column_stack([-ego_y, 2.0 + step + np.arange(1, 6)]), atol=1e-5)
        assert all(p.pose.vec.z == pytest.approx(0.5) for p in poses)

    obs = policy.seen[-1]
    assert obs[f"observation/{WIDE}"].shape == (8, 12, 3) and obs[f"observation/{TELE}"].dtype == np.uint8
    assert obs["observation/state"].shape == (16,) and obs["observation/state"].dtype == np.float32
    np.testing.assert_allclose(obs["observation/state"][[0, 1, 7, 12]], [0.0, 4.0, 10.0, 0.1], atol=1e-6)
    np.testing.assert_allclose(
        obs["observation/ego_history"], [[-3, 0, 0], [-2, 0, 0], [-1, 0, 0], [0, 0, 0]], atol=1e-5
    )
    # the route was sent in the rig frame at y=2; the car has since moved 2 m forward; padded to 3 rows
    np.testing.assert_allclose(obs["observation/route"], [[3, 0, 0], [8, 1, 0], [8, 1, 0]], atol=1e-5)
    assert obs["prompt"] == "follow the route" and "observation/ground_truth" not in obs
    assert not isinstance(d.call("close_session", d.pb.ego.DriveSessionCloseRequest(session_uuid="s1")), Exception)
    d.refused("drive", d.drive("s1", T0 + 5 * DT), "NOT_FOUND", "session_uuid")


def test_upstream_bytes(pb: Any) -> None:
    """Messages encoded by upstream's generated code parse field by field, and our reply is byte-identical."""
    c, ego = pb.common, pb.ego
    start = ego.DriveSessionRequest.FromString(bytes.fromhex(UPSTREAM["start_session"]))
    cam = start.rollout_spec.vehicle.available_cameras[0]
    assert (start.session_uuid, start.random_seed, start.debug_info.scene_id) == ("golden", 7, "clipgt-1")
    assert (cam.logical_id, cam.intrinsics.resolution_h, cam.intrinsics.resolution_w) == (WIDE, 8, 12)
    assert cam.intrinsics.ftheta_param.max_angle == pytest.approx(1.2) and cam.rig_to_camera.vec.z == 1.25
    ego_msg = ego.RolloutEgoTrajectory.FromString(bytes.fromhex(UPSTREAM["egomotion"]))
    assert ego_msg.trajectory.poses[0].timestamp_us == T0 and ego_msg.dynamic_states[0].linear_velocity.x == 5.0
    route = ego.RouteRequest.FromString(bytes.fromhex(UPSTREAM["route"]))
    assert route.route.timestamp_us == T0 and route.route.waypoints[1].y == 2.0
    drive = ego.DriveRequest.FromString(bytes.fromhex(UPSTREAM["drive"]))
    assert (drive.time_now_us, drive.time_query_us, drive.renderer_data) == (T0, T0 + DT, b"\x01\x02")
    pose = c.Pose(vec=c.Vec3(x=10.0, y=20.0, z=0.5), quat=c.Quat(w=0.70710677, z=0.70710677))
    reply = ego.DriveResponse(
        trajectory=c.Trajectory(poses=[c.PoseAtTime(pose=pose, timestamp_us=T0 + DT)]), terminate_session=True
    )
    assert reply.SerializeToString(deterministic=True).hex() == UPSTREAM["response"]
    service = ego.DESCRIPTOR.services_by_name["EgodriverService"]
    assert service.full_name == "egodriver.EgodriverService"
    assert [m.name for m in service.methods] == [
        "start_session", "close_session", "submit_image_observation", "submit_egomotion_observation",
        "submit_route", "submit_recording_ground_truth", "drive", "get_version",
    ]  # fmt: skip


def test_bad_requests_get_clear_statuses_and_the_server_survives(driver: tuple[Driver, RecordingPolicy]) -> None:
    d, policy = driver
    ego, common = d.pb.ego, d.pb.common
    d.refused("start_session", d.start(""), "INVALID_ARGUMENT", "session_uuid")
    for name, msg in [
        ("submit_image_observation", d.image("ghost", WIDE, _encoded(8, 12))),
        ("submit_egomotion_observation", d.ego("ghost", [(T0, 0, 0, 0)])),
        ("submit_route", d.route("ghost", [(1, 0, 0)])),
        ("drive", d.drive("ghost")),
        ("close_session", ego.DriveSessionCloseRequest(session_uuid="ghost")),
    ]:
        d.refused(name, msg, "NOT_FOUND", "session_uuid")
    d.call("start_session", d.start("s"))
    d.refused("start_session", d.start("s"), "ALREADY_EXISTS", "session_uuid")
    d.refused("drive", d.drive("s"), "FAILED_PRECONDITION", "camera_image")  # before any image
    d.refused("submit_image_observation", d.image("s", WIDE, _encoded(4, 6)), "INVALID_ARGUMENT", "image_bytes")
    d.refused("submit_image_observation", d.image("s", WIDE, b"\xff\xd8garbage"), "INVALID_ARGUMENT", "image_bytes")
    d.refused("submit_image_observation", d.image("s", WIDE, b""), "INVALID_ARGUMENT", "image_bytes")
    d.refused(
        "submit_image_observation", d.image("s", "camera_rear", _encoded(8, 12)), "INVALID_ARGUMENT", "logical_id"
    )
    d.refused("submit_image_observation", ego.RolloutCameraImage(session_uuid="s"), "INVALID_ARGUMENT", "camera_image")
    for cam, (h, w) in ((WIDE, (8, 12)), (TELE, (4, 6))):
        d.call("submit_image_observation", d.image("s", cam, _encoded(h, w)))
    d.refused("drive", d.drive("s"), "FAILED_PRECONDITION", "submit_egomotion_observation")  # before any pose
    bad_states = d.ego("s", [(T0, 0, 0, 0)])
    bad_states.dynamic_states.add()
    d.refused("submit_egomotion_observation", bad_states, "INVALID_ARGUMENT", "dynamic_states")
    unset_quat = ego.RolloutEgoTrajectory(session_uuid="s", trajectory=common.Trajectory(poses=[common.PoseAtTime()]))
    d.refused("submit_egomotion_observation", unset_quat, "INVALID_ARGUMENT", "trajectory.poses[0].pose.quat")
    d.refused("submit_egomotion_observation", ego.RolloutEgoTrajectory(session_uuid="s"), "INVALID_ARGUMENT", "poses")
    d.refused("submit_route", d.route("s", [(1, 0, 0), (np.nan, 0, 0)]), "INVALID_ARGUMENT", "route.waypoints[1]")
    d.call("submit_egomotion_observation", d.ego("s", [(T0, 0, 0, np.pi / 2)]))
    d.refused("drive", d.drive("s", T0 - 1), "FAILED_PRECONDITION", "time_now_us")
    # the policy misbehaves: wrong shape, no actions, unreachable backend
    policy.result = {"actions": np.zeros((5, 7))}
    d.refused("drive", d.drive("s"), "INTERNAL", "actions: shape (5, 7)")
    policy.result = {"action": np.zeros((5, 2))}
    d.refused("drive", d.drive("s"), "INTERNAL", "actions")
    policy.result, policy.error = None, ConnectionError("ws://gpu:8000 is down")
    d.refused("drive", d.drive("s"), "UNAVAILABLE", "ws://gpu:8000 is down")
    policy.error = None
    # still serving, and the good session is intact
    reply = d.call("drive", d.drive("s"))
    assert not isinstance(reply, Exception) and len(reply.trajectory.poses) == 6


def test_policy_contract_mismatches(pb: Any) -> None:
    spec = InputSpec({"observation/image": ArraySpec((8, 12, 3), "uint8")}, allow_extra=True)
    policy = RecordingPolicy(width=3, spec=spec)
    d = Driver(pb, policy, AlpasimDriverConfig(cameras=(WIDE,), max_sessions=2))
    try:
        d.ready("a")
        d.refused("drive", d.drive("a"), "FAILED_PRECONDITION", "observation/image")  # camera_map not set
        d.refused("start_session", d.start("b", cameras=((TELE, 4, 6),)), "FAILED_PRECONDITION", WIDE)
        d.call("start_session", d.start("b"))
        d.refused("start_session", d.start("c"), "RESOURCE_EXHAUSTED", "max_sessions")
    finally:
        d.close()
    mapped = Driver(pb, policy, AlpasimDriverConfig(cameras=(WIDE,), camera_map={WIDE: "image"}))
    try:
        mapped.ready("a")
        policy.result = {"actions": np.array([[1.0, 0.0, 0.25]]), "terminate_session": True}
        reply = mapped.call("drive", mapped.drive("a"))
        assert reply.terminate_session and TELE not in str(sorted(policy.seen[-1]))  # unused camera dropped
        assert quat_to_yaw(np.array([[getattr(reply.trajectory.poses[1].pose.quat, k) for k in "wxyz"]]))[0] == (
            pytest.approx(np.pi / 2 + 0.25, abs=1e-6)
        )
    finally:
        mapped.close()


def test_factory_gives_each_session_its_own_policy(pb: Any) -> None:
    made: list[RecordingPolicy] = []

    def factory() -> RecordingPolicy:
        made.append(RecordingPolicy())
        return made[-1]

    d = Driver(pb, factory)
    try:
        d.ready("a")
        d.ready("b")
        for uuid in ("a", "b", "a"):
            assert not isinstance(d.call("drive", d.drive(uuid)), Exception)
        assert [len(p.seen) for p in made] == [2, 1] and all(p.resets == 1 for p in made)
        d.call("close_session", pb.ego.DriveSessionCloseRequest(session_uuid="a"))
        assert made[0].closed and not made[1].closed
    finally:
        d.close()
    assert made[1].closed  # stopping the server closes what is left


def test_generated_modules_match_the_proto_files(pb: Any, tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    from google.protobuf import descriptor_pb2

    src = PROTO_DIR.parents[2]
    out = tmp_path / "set.pb"
    args = [
        "protoc",
        f"-I{src}",
        f"--descriptor_set_out={out}",
        "--include_imports",
        str(PROTO_DIR / "egodriver.proto"),
    ]
    assert protoc.main(args) == 0
    compiled = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file}
    for module in (pb.common, pb.sensorsim, pb.ego):
        committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        fresh = compiled[module.DESCRIPTOR.name]
        for fdp in (committed, fresh):  # protoc's descriptor sets add json_name; the generated modules do not
            stack = list(fdp.message_type)
            while stack:
                msg = stack.pop()
                stack.extend(msg.nested_type)
                for fld in msg.field:
                    fld.ClearField("json_name")
        assert committed == fresh, f"{module.__name__} is stale: run scripts/gen_alpasim_proto.sh"
    methods = [m.name for m in pb.ego.DESCRIPTOR.services_by_name["EgodriverService"].methods]
    assert all(callable(getattr(pb.grpc_mod.EgodriverServiceServicer, m, None)) for m in methods)
    # the [alpasim] extra's floors admit the committed code's generator
    text = (PROTO_DIR / "egodriver_pb2_grpc.py").read_text() + (PROTO_DIR / "egodriver_pb2.py").read_text()
    extra = (REPO / "policy_server" / "pyproject.toml").read_text()
    grpc_gen = text.split("GRPC_GENERATED_VERSION = '")[1].split("'")[0]
    proto_gen = text.split("# Protobuf Python Version: ")[1].split()[0]
    assert f'"grpcio>={grpc_gen}"' in extra and f'"protobuf>={proto_gen}"' in extra


def test_through_a_websocket_policy_server(pb: Any) -> None:
    """The launcher's deployment: AlpaSim -> this driver -> one websocket connection per rollout -> policy."""
    from cosmos_robot_server import PolicyServer, ServerConfig
    from cosmos_robot_server.alpasim.launcher import policy_factory

    model = RecordingPolicy(width=3)
    with PolicyServer(model, ServerConfig(port=0, transports=("ws",))) as ws_server:
        url = f"ws://127.0.0.1:{ws_server.ports['ws']}"
        args = build_parser().parse_args(["--policy", url, "--connect-timeout", "5", "--camera-map", f"{WIDE}=image"])
        d = Driver(pb, policy_factory(args), config_from_args(args))
        try:
            d.ready("a")
            d.ready("b")
            for uuid in ("a", "b"):
                reply = d.call("drive", d.drive(uuid))
                assert not isinstance(reply, Exception), reply
                assert len(reply.trajectory.poses) == 6
            assert {"observation/image", f"observation/{TELE}", "observation/state"} <= set(model.seen[-1])
            assert model.seen[-1]["observation/image"].shape == (8, 12, 3)
        finally:
            d.close()
