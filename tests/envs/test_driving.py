"""The driving suite (issue 20): highway-env behind AlpaSim's boundary.

Real highway-env episodes (no doubles): Gymnasium's own checker, seeded determinism, the expert's
replay as ground truth (driving the expert gives a distance of exactly 0), the tracker following a
plan, AlpaGym's metrics and reward terms, and clear errors for bad plans."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("highway_env")

from cosmos_robot_envs.driving import DT, ENV_ID, SCENARIOS, DrivingEnv, DrivingExpertPolicy
from cosmos_robot_envs.driving.geometry import TrackerGains, to_ego, track_plan


def straight_plan(speed: float, n: int = 20) -> np.ndarray:
    return np.stack([np.array([speed * DT * (k + 1), 0.0]) for k in range(n)]).astype(np.float32)


def run(env: DrivingEnv, plans: Any, seed: int, task: str = "highway") -> tuple[list[dict[str, Any]], list[Any]]:
    obs, info = env.reset(seed=seed, options={"task": task})
    observations, infos = [obs], [info]
    for k in range(env.max_steps):
        plan = plans(env) if callable(plans) else plans[k]
        obs, _, terminated, truncated, info = env.step(plan)
        observations.append(obs)
        infos.append(info)
        if terminated or truncated:
            break
    return observations, infos


def test_gymnasium_check_env_passes() -> None:
    from gymnasium.utils.env_checker import check_env

    env = DrivingEnv(max_steps=20, expert_replay=False)
    check_env(env, skip_render_check=True)
    env.close()


def _traffic(sim: Any) -> np.ndarray:
    """Every road user's pose, speed, crash flag and lane, as one array (bitwise comparable)."""
    road = sim.unwrapped.road
    return np.array(
        [[*v.position, v.heading, v.speed, float(v.crashed), float(v.lane_index[2])] for v in road.vehicles]
    )


@pytest.mark.parametrize("task", ["highway", "highway_dense"])
def test_fast_road_steps_the_traffic_bit_for_bit_like_highway_env(task: str) -> None:
    """``FastRoad``'s numpy pre-filters change no outcome: with the same seed and the same wild actions
    (the ego weaves and brakes, so neighbours re-plan, change lanes and crash), every vehicle's pose,
    speed, crash flag and lane equal highway-env's own ``Road`` at every tick."""
    from cosmos_robot_envs.driving.fast_road import FastRoad
    from cosmos_robot_envs.driving.scenarios import make_scenario

    crashed = 0
    for seed in (1, 2):
        sims = [make_scenario(task, 8.0, fast_road=fast) for fast in (False, True)]
        for sim in sims:
            sim.reset(seed=seed)
        assert type(sims[0].unwrapped.road) is not FastRoad and type(sims[1].unwrapped.road) is FastRoad
        rng = np.random.default_rng(seed)
        for _ in range(60):
            action = (rng.uniform(-1, 1, 2) * np.array([1.0, 0.05])).astype(np.float32)
            for sim in sims:
                sim.step(action)
            slow, fast = (_traffic(sim) for sim in sims)
            assert slow.shape == fast.shape and np.array_equal(slow, fast)
        crashed += int(slow[:, 4].sum())
        for sim in sims:
            sim.close()
    assert crashed > 0  # the collision path ran
    assert type(make_scenario("merge", 8.0).unwrapped.road) is not FastRoad  # ~10 vehicles: highway-env's own


def test_registered_and_camera_mode_has_an_image() -> None:
    env = gym.make(ENV_ID, tasks=["highway"], obs_mode="camera", image_size=32, max_steps=5, expert_replay=False)
    obs, info = env.reset(seed=0)
    assert obs["image"].shape == (32, 128, 3) and obs["image"].dtype == np.uint8 and obs["image"].std() > 0
    assert env.observation_space.contains(obs) and info["task"] == "highway"
    env.close()


def test_same_seed_same_plans_same_episode_bitwise_and_expert_matches_its_replay() -> None:
    env = DrivingEnv(max_steps=40)
    obs_a, infos_a = run(env, lambda e: e.expert_action(), seed=11)
    obs_b, infos_b = run(env, lambda e: e.expert_action(), seed=11)
    assert len(obs_a) == len(obs_b) == 41
    for a, b in zip(obs_a, obs_b, strict=True):
        for key in a:
            assert np.array_equal(a[key], b[key]), key
    # the ground truth is the expert's replay of the seed: driving the expert reproduces it exactly
    assert all(i["dist_to_gt"] == 0.0 for i in infos_a)
    assert infos_a[-1]["progress"] == pytest.approx(1.0) and infos_a[-1]["is_success"]
    other, _ = run(env, lambda e: e.expert_action(), seed=12)
    assert not np.array_equal(other[0]["agents"], obs_a[0]["agents"])  # another seed, another scene


def test_progress_is_measured_against_the_experts_pace_when_the_expert_crashed() -> None:
    """On a seed where the expert itself crashes at tick ~25 of 100, progress divides by the expert's
    path extrapolated to the horizon (its pace), not by 2.5 s of driving: the expert's own progress at
    its crash is its share of the horizon, so a planner that drives on safely is not scored at 3-4."""
    env = DrivingEnv(tasks=["highway_dense"], max_steps=100)
    _, infos = run(env, lambda e: e.expert_action(), seed=477904159, task="highway_dense")
    ticks = len(infos) - 1
    assert infos[-1]["collision"] and ticks < 40
    assert infos[-1]["progress"] == pytest.approx(ticks / 100, rel=1e-3)  # along the lane vs along the path
    env.close()


def test_a_stopping_plan_loses_progress_and_drifts_from_the_ground_truth() -> None:
    env = DrivingEnv(max_steps=30)
    _, infos = run(env, lambda e: np.zeros((e.plan_len, 2), np.float32), seed=5)
    last = infos[-1]
    assert infos[1]["speed"] < infos[0]["speed"]  # the tracker brakes for a plan that stays put
    assert last["progress"] < 0.8 and last["dist_to_gt"] > 5.0 and last["mean_dist_to_gt"] > 0
    terms = last["reward_terms"]
    assert set(terms) == {"progress", "collision", "offroad", "dist_to_gt"} and terms["dist_to_gt"] < 0


def test_episode_reward_is_the_sum_of_its_terms_and_progress_is_normalised() -> None:
    env = DrivingEnv(max_steps=25)
    env.reset(seed=2, options={"task": "highway"})
    total, progress = 0.0, 0.0
    for _ in range(25):
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        total += reward
        progress += info["reward_terms"]["progress"]
        if terminated or truncated:
            break
    assert progress == pytest.approx(info["progress"], rel=1e-9)
    assert total == pytest.approx(info["progress"] - 0.01 * info["mean_dist_to_gt"] * info["tick"] / 25)
    env_gt = DrivingEnv(max_steps=10, reward="distance_to_gt")
    env_gt.reset(seed=2)
    _, reward, *_ = env_gt.step(np.zeros((20, 2), np.float32))
    assert reward <= 0.0


def test_driving_into_the_barrier_is_offroad_and_ends_the_episode() -> None:
    env = DrivingEnv(max_steps=80, expert_replay=False)
    _, infos = run(env, lambda e: np.array([[3.0 * (k + 1), 2.0 * (k + 1)] for k in range(20)], np.float32), seed=4)
    assert infos[-1]["offroad"] or infos[-1]["collision"]
    assert infos[-1]["tick"] < 80 and not infos[-1]["is_success"]


def test_tracker_follows_speed_and_turns_toward_the_plan() -> None:
    gains = TrackerGains()
    hold = track_plan(straight_plan(25.0), 25.0, DT, 5.0, gains)
    assert abs(hold[0]) < 1e-6 and abs(hold[1]) < 1e-9
    faster = track_plan(straight_plan(30.0), 25.0, DT, 5.0, gains)
    assert faster[0] > 0
    left = straight_plan(25.0)
    left[:, 1] = np.linspace(0.1, 3.0, 20)  # rig frame: +y is the driver's left (highway-env's -y)
    assert track_plan(left, 25.0, DT, 5.0, gains)[1] < 0  # highway-env steers left with a negative angle
    assert track_plan(-left, 25.0, DT, 5.0, gains)[0] == -1.0  # pointing backwards: brake
    # facing the right-hand lanes (world +y), the road ahead (world +x) is on the driver's left
    pts = to_ego(np.array([[10.0, 0.0]]), np.zeros(2), math.pi / 2)
    np.testing.assert_allclose(pts, [[0.0, 10.0]], atol=1e-12)


def test_every_scenario_runs_with_the_expert() -> None:
    env = DrivingEnv(max_steps=15, expert_replay=False)
    for task in SCENARIOS:
        obs, infos = run(env, lambda e: e.expert_action(), seed=1, task=task)
        assert infos[-1]["task"] == task and env.observation_space.contains(obs[-1])
        assert infos[-1]["progress_m"] > 15 * DT * 10  # moving at highway speeds


def test_merge_ends_with_its_road_and_that_is_a_success() -> None:
    env = DrivingEnv(max_steps=200, expert_replay=False)
    _, infos = run(env, lambda e: e.expert_action(), seed=2, task="merge")
    last = infos[-1]
    assert last["route_complete"] and last["tick"] < 200 and last["is_success"]


def test_bad_plans_and_options_are_named() -> None:
    env = DrivingEnv(max_steps=5, expert_replay=False)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action: a plan of shape \(40,\) or \(20, 2\).*got shape \(7,\)"):
        env.step(np.zeros(7, np.float32))
    bad = np.zeros((20, 2), np.float32)
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="action: the plan holds NaN or inf"):
        env.step(bad)
    with pytest.raises(ValueError, match="task 'city' is not a driving scenario"):
        env.reset(options={"task": "city"})
    with pytest.raises(ValueError, match="tasks: \\['city'\\] not driving scenarios"):
        DrivingEnv(tasks=["city"])
    env.reset(seed=0)
    done = False
    while not done:
        *_, terminated, truncated, _ = env.step(np.zeros((20, 2), np.float32))
        done = terminated or truncated
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(np.zeros((20, 2), np.float32))


def test_the_observation_level_expert_drives_from_the_wire_state() -> None:
    """``DrivingExpertPolicy`` sees only ``observation/state``; it keeps the lane and speed: no crash, no
    leaving the road, close to the privileged expert's replay on a seed where both run undisturbed."""
    policy = DrivingExpertPolicy()
    env = DrivingEnv(max_steps=60)
    _, infos = run(env, lambda e: policy.infer({"observation/state": e._observe()["state"]})["actions"][0], seed=7)
    last = infos[-1]
    assert last["is_success"] and not last["collision"] and not last["offroad"]
    assert last["progress"] > 0.9 and last["mean_dist_to_gt"] < 3.0
    with pytest.raises(ValueError, match=r"observation/state: expected shape \(137,\), got \(5,\)"):
        policy.infer({"observation/state": np.zeros(5, np.float32)})


def test_eval_suite_driving_runs_the_served_expert_over_websocket(tmp_path: Any) -> None:
    """``cosmos-robot eval --suite driving``'s path: the vector layer's env workers, the wire mapping (a
    state-only planner: no rendering), one plan per request over a real websocket server."""
    from cosmos_robot_envs.eval import EvalConfig, connect_websocket, run_eval
    from cosmos_robot_server import PolicyServer, ServerConfig

    config = EvalConfig(
        policy="ws", suite="driving", tasks=("highway", "merge"), episodes_per_task=2, num_envs=2,
        replan_steps=1, max_steps=40, video_episodes=0,
    )  # fmt: skip
    with PolicyServer(DrivingExpertPolicy(), ServerConfig(port=0)) as server:
        url = f"ws://127.0.0.1:{server.ports['ws']}"
        with connect_websocket(url) as policy:
            results = run_eval(config, policy, tmp_path, policy_kind="websocket")
    episodes = results["episodes"]
    assert len(episodes) == 4 and {e["task"] for e in episodes} == {"highway", "merge"}
    assert sum(e["success"] for e in episodes) >= 3, episodes
    # AlpaGym's episode metrics travel from the env workers into every record and the summary
    assert all(set(e["metrics"]) == {"progress", "collision", "offroad", "mean_dist_to_gt"} for e in episodes)
    highway = results["tasks"]["highway"]["metrics"]
    assert highway["collision"]["n"] == 2 and 0.0 <= highway["collision"]["ci95"][0] <= highway["collision"]["mean"]
    assert highway["progress"]["mean"] > 0.5
