"""The loopback AlpaSim runtime: the driving suite driven through our ``EgodriverService`` driver.

Real parts: highway-env episodes, the real driver servicer, a real gRPC server and channel on
loopback. Proved here: gRPC and in-process give bitwise-equal trajectories; the frames round-trip
(a policy that returns the privileged expert's plan through the driver reproduces the expert's
episode); camera frames reach the policy; a driver refusal surfaces with its status."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("highway_env")
pytest.importorskip("grpc")

from cosmos_robot.driving import AlpasimLoopback, DriverCallError, RouteKeepingPolicy
from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_envs.driving import DrivingEnv
from cosmos_robot_server.alpasim import AlpasimDriverConfig, AlpasimDriverServer, AlpasimDriverServicer

STATE_ONLY = AlpasimDriverConfig(cameras=(), route_length=20)


def test_grpc_and_in_process_give_bitwise_equal_trajectories() -> None:
    env = DrivingEnv(max_steps=30)
    policy = RouteKeepingPolicy()
    with AlpasimDriverServer(policy, "127.0.0.1", 0, config=STATE_ONLY) as server:
        with AlpasimLoopback.over_grpc(server.address) as remote:
            over_grpc = remote.run_episode(env, seed=3, task="highway")
    local = AlpasimLoopback.in_process(AlpasimDriverServicer(policy, STATE_ONLY))
    in_process = local.run_episode(env, seed=3, task="highway")
    assert len(over_grpc.plans) == len(in_process.plans) > 0
    for a, b in zip(over_grpc.positions, in_process.positions, strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(over_grpc.plans, in_process.plans, strict=True):
        assert np.array_equal(a, b)
    assert over_grpc.reward == in_process.reward
    assert in_process.infos[-1]["progress_m"] > 50  # it drives: ~25 m/s for 3 s


class ExpertThroughTheDriver(BasePolicy):
    """Answers the env's privileged expert plan (rig frame, as the suite's plans are): if every frame
    conversion of the runtime and the driver is right, the episode is the expert's own (distance to its
    replay ~0)."""

    def __init__(self, env: DrivingEnv) -> None:
        self.env = env

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {"actions": self.env.expert_action().reshape(-1, 2)}


def test_the_expert_plan_round_trips_through_the_driver() -> None:
    env = DrivingEnv(max_steps=40)
    runtime = AlpasimLoopback.in_process(AlpasimDriverServicer(ExpertThroughTheDriver(env), STATE_ONLY))
    episode = runtime.run_episode(env, seed=9, task="highway")
    assert len(episode.infos) == 40 and episode.infos[-1]["is_success"]
    # float32 poses on the wire (positions of a few hundred metres): the replay is matched to millimetres
    assert max(i["dist_to_gt"] for i in episode.infos) < 0.01
    assert episode.infos[-1]["progress"] == pytest.approx(1.0, abs=1e-3)


class ComparesWithTheEnv(ExpertThroughTheDriver):
    """Records, each tick, what the driver hands the policy beside what the env itself observes."""

    def __init__(self, env: DrivingEnv) -> None:
        super().__init__(env)
        self.pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.pairs.append((dict(obs), self.env._observe()))
        return super().infer(obs)


def test_the_driver_hands_the_policy_what_the_env_observes() -> None:
    """The AlpaSim keys of the suite (``ego_history``, ``route``, the top-down camera) are what AlpaSim's
    driver builds from the poses, the route and the frames it is sent: a planner trained on the suite's
    recordings sees the same arrays when it drives through ``serve --alpasim-port``."""
    env = DrivingEnv(max_steps=25, obs_mode="camera", image_size=32, expert_replay=False)
    policy = ComparesWithTheEnv(env)
    config = AlpasimDriverConfig(camera_map={"camera_top_down": "image"}, route_length=20)
    AlpasimLoopback.in_process(AlpasimDriverServicer(policy, config), camera=True).run_episode(
        env, seed=4, task="merge"
    )
    assert len(policy.pairs) == 25
    moved = 0.0
    for wire, own in policy.pairs:
        assert wire["observation/ego_history"].shape == own["ego_history"].shape == (16, 3)
        assert wire["observation/route"].shape == own["route"].shape == (20, 3)
        # float32 poses on the wire, world positions of hundreds of metres: equal to a millimetre
        np.testing.assert_allclose(wire["observation/ego_history"], own["ego_history"], atol=2e-3)
        np.testing.assert_allclose(wire["observation/route"], own["route"], atol=2e-3)
        assert np.array_equal(wire["observation/image"], own["image"])  # PNG is lossless
        moved = max(moved, float(np.abs(own["ego_history"][0, 0])))
    assert moved > 20.0  # 1.5 s of history at highway speed: the comparison covered real motion


class SeesTheCamera(RouteKeepingPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[np.ndarray] = []

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.frames.append(np.asarray(obs["observation/image"]))
        return super().infer(obs)


def test_camera_frames_reach_the_policy() -> None:
    env = DrivingEnv(max_steps=3, obs_mode="camera", image_size=32, expert_replay=False)
    policy = SeesTheCamera()
    config = AlpasimDriverConfig(camera_map={"camera_top_down": "image"}, route_length=20)
    episode = AlpasimLoopback.in_process(AlpasimDriverServicer(policy, config), camera=True).run_episode(
        env, seed=1, task="highway"
    )
    assert len(episode.plans) == 3 and len(policy.frames) == 3
    assert policy.frames[0].shape == (32, 128, 3) and policy.frames[0].dtype == np.uint8


def test_a_driver_refusal_names_the_method_and_status() -> None:
    env = DrivingEnv(max_steps=3, expert_replay=False)
    config = AlpasimDriverConfig(route_length=20)  # cameras=None: drive needs a frame, and none is sent
    runtime = AlpasimLoopback.in_process(AlpasimDriverServicer(RouteKeepingPolicy(), config))
    with pytest.raises(DriverCallError, match="drive: FAILED_PRECONDITION"):
        runtime.run_episode(env, seed=0, task="highway")
    with pytest.raises(ValueError, match="needs DrivingEnv\\(obs_mode='camera'\\)"):
        AlpasimLoopback.in_process(AlpasimDriverServicer(RouteKeepingPolicy(), config), camera=True).run_episode(
            env, seed=0, task="highway"
        )
