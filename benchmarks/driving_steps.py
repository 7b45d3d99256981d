"""Driving-suite ticks per second: highway-env's own ``Road`` against ``FastRoad``, in one run.

Why: closed-loop RL of a planner (issue 20) is bound by simulator ticks, and on ``highway_dense`` most
of a tick is highway-env's O(n^2) Python traffic loops, which ``FastRoad`` narrows with numpy
(envs/src/cosmos_robot_envs/driving/fast_road.py). Both roads drive the same seeded episodes with the
privileged expert (the DrivingEnv minus its ground-truth replay, which is another expert episode),
alternating road by road so that both see the same machine load; the script also checks that both
produced the same trajectories (FastRoad changes no outcome).

    python benchmarks/driving_steps.py --episodes 4 --ticks 100
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from cosmos_robot_envs.driving import DT, SCENARIOS
from cosmos_robot_envs.driving.expert import IDMParams, expert_plan
from cosmos_robot_envs.driving.geometry import TrackerGains, track_plan
from cosmos_robot_envs.driving.scenarios import make_scenario


def _episode(task: str, seed: int, ticks: int, fast: bool) -> tuple[float, int, np.ndarray]:
    sim = make_scenario(task, duration_s=ticks * DT, fast_road=fast)
    sim.reset(seed=seed)
    env, gains, idm = sim.unwrapped, TrackerGains(), IDMParams()
    positions = []
    start = time.perf_counter()
    for _ in range(ticks):
        plan = expert_plan(env.road, env.vehicle, 20, DT, idm)
        _, _, terminated, truncated, _ = sim.step(
            track_plan(plan, float(env.vehicle.speed), DT, env.vehicle.LENGTH, gains)
        )
        positions.append(np.array([v.position for v in env.road.vehicles]).ravel())
        if env.vehicle.crashed or terminated or truncated:
            break
    elapsed = time.perf_counter() - start
    sim.close()
    return elapsed, len(positions), np.concatenate(positions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=4, help="seeded episodes per scenario and road")
    parser.add_argument("--ticks", type=int, default=100, help="ticks per episode (0.1 s each)")
    parser.add_argument("--seed", type=int, default=0)
    # merge (~10 vehicles) always runs on highway-env's own Road (make_scenario): nothing to compare
    parser.add_argument("--tasks", nargs="+", default=["highway", "highway_dense"], choices=sorted(SCENARIOS))
    args = parser.parse_args()
    rows = []
    for task in args.tasks:
        totals = {False: [0.0, 0], True: [0.0, 0]}
        same = True
        for episode in range(args.episodes):
            runs = {}
            for fast in (False, True) if episode % 2 == 0 else (True, False):
                elapsed, ticks, trajectory = _episode(task, args.seed + episode, args.ticks, fast)
                totals[fast][0] += elapsed
                totals[fast][1] += ticks
                runs[fast] = trajectory
            same &= bool(np.array_equal(runs[False], runs[True]))
        slow, fast = (totals[k][1] / totals[k][0] for k in (False, True))
        rows.append(
            {
                "task": task,
                "ticks": totals[True][1],
                "highway_env_road_tps": round(slow, 1),
                "fast_road_tps": round(fast, 1),
                "speedup": round(fast / slow, 2),
                "same_trajectories": same,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print("\n| scenario | ticks | highway-env Road ticks/s | FastRoad ticks/s | speed-up | same trajectories |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['task']} | {r['ticks']} | {r['highway_env_road_tps']} | {r['fast_road_tps']} | "
            f"{r['speedup']}x | {r['same_trajectories']} |"
        )


if __name__ == "__main__":
    main()
