"""LIBERO speed: raw robosuite loop vs our env through the vector layer, 1 and N envs, and eval episodes/min.

Side by side in one run, on libero_spatial task 0 (two cameras, zero actions, no episode ends):

- ``raw LIBERO``: LIBERO's own ``OffScreenRenderEnv`` stepped in a plain loop in the LIBERO
  interpreter (what openpi's LIBERO client does), N=1: the ceiling;
- ``ours, N envs``: ``Libero/Libero-v0`` workers under the LIBERO interpreter through
  ``make_vector_env(mode="async")``, stepped in lockstep: env-steps/s = N x steps / wall time;
- ``eval``: ``run_eval`` of a constant policy on libero_spatial with N envs and the suite's full
  episode length (max_steps 220; a constant policy never succeeds, so every episode runs to the end),
  episodes per minute including resets.

On a CPU, rendering is Mesa llvmpipe (software GL, both cores); on the GPU machine MuJoCo renders
through EGL on the GPU.

    .venv/bin/python benchmarks/libero_envs.py --image-size 128 --num-envs 1 2 [--eval-envs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import textwrap
import time
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
from rich.console import Console
from rich.table import Table

from cosmos_robot_envs.eval import EvalConfig, run_eval
from cosmos_robot_envs.libero import ENV_ID, libero_catalog, libero_python
from cosmos_robot_envs.vector import EnvFactory, make_vector_env
from cosmos_robot_server.example_policies import constant

RAW = """
import json, sys, time
import numpy as np
from cosmos_robot_envs.libero.catalog import get_task, load_init_states, prepare, suite_tasks
prepare()
from libero.libero.envs import OffScreenRenderEnv
size, steps = int(sys.argv[1]), int(sys.argv[2])
task = get_task("libero_spatial", suite_tasks("libero_spatial")[0])
env = OffScreenRenderEnv(bddl_file_name=str(task.bddl_file), camera_heights=size, camera_widths=size)
env.seed(0)
t0 = time.perf_counter(); env.reset(); env.set_init_state(load_init_states(task.init_states_file)[0])
reset_s = time.perf_counter() - t0
for _ in range(5):
    env.step(np.zeros(7))
t0 = time.perf_counter()
for _ in range(steps):
    env.step(np.zeros(7))
print(json.dumps({"steps_per_s": steps / (time.perf_counter() - t0), "reset_s": reset_s}))
env.close()
"""


def raw_rate(python: str, size: int, steps: int) -> dict[str, float]:
    done = subprocess.run(
        [python, "-c", textwrap.dedent(RAW), str(size), str(steps)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def vector_rate(python: str, size: int, n: int, steps: int) -> dict[str, float]:
    task = libero_catalog(python)["libero_spatial"]["tasks"][0]["name"]
    factory = EnvFactory(ENV_ID, {"suite": "libero_spatial", "image_size": size, "max_steps": 10_000}, python=python)
    t0 = time.perf_counter()
    with make_vector_env([factory] * n, mode="async", reset_timeout=600) as venv:
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        venv.reset(seeds=list(range(n)), options=[{"task": task, "init_state": i} for i in range(n)])
        reset_s = time.perf_counter() - t0
        zeros = np.zeros((n, 7), np.float32)
        for _ in range(5):
            venv.step(zeros)
        t0 = time.perf_counter()
        for _ in range(steps):
            venv.step(zeros)
        wall = time.perf_counter() - t0
    return {"steps_per_s": n * steps / wall, "start_s": start_s, "reset_s": reset_s}


def eval_rate(size: int, n: int, per_task: int) -> dict[str, float]:
    config = EvalConfig(
        policy="cosmos_robot_server.example_policies:constant",
        suite="libero_spatial",
        episodes_per_task=per_task,
        num_envs=n,
        image_size=size,
        vector_mode="async",
        video_episodes=0,  # measure the loop, not the MP4 encoder
    )
    with tempfile.TemporaryDirectory() as out:
        results = run_eval(config, constant(action_horizon=10, action_dim=7), out, policy_kind="in_process")
    t = results["throughput"]
    return {"episodes_per_min": t["episodes_per_min"], "loop_s": t["loop_s"], "episodes": t["episodes_this_run"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-size", type=int, nargs="+", default=[128])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per env")
    parser.add_argument("--eval-envs", type=int, default=0, help="also time an eval with this many envs (0: skip)")
    parser.add_argument("--eval-per-task", type=int, default=1, help="episodes per task of that eval (10 tasks)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    python = libero_python()
    rows: list[dict[str, Any]] = []
    for size in args.image_size:
        raw = raw_rate(python, size, args.steps)
        rows.append({"what": "raw LIBERO loop", "image": size, "envs": 1, **raw})
        for n in args.num_envs:
            rows.append(
                {"what": "ours (vector layer)", "image": size, "envs": n, **vector_rate(python, size, n, args.steps)}
            )
    evals = []
    if args.eval_envs:
        size = args.image_size[-1]
        evals.append(
            {
                "image": size,
                "envs": args.eval_envs,
                **eval_rate(size, args.eval_envs, args.eval_per_task),
            }
        )
    table = Table(
        title=f"LIBERO libero_spatial, {platform.node()}, {os.cpu_count()} CPUs, MUJOCO_GL={os.environ['MUJOCO_GL']}"
    )
    for col in ("what", "image", "envs", "env steps/s", "vs raw", "reset s"):
        table.add_column(col)
    for row in rows:
        base = next(r for r in rows if r["what"] == "raw LIBERO loop" and r["image"] == row["image"])
        table.add_row(
            row["what"],
            str(row["image"]),
            str(row["envs"]),
            f"{row['steps_per_s']:.1f}",
            f"{row['steps_per_s'] / base['steps_per_s']:.2f}x",
            f"{row['reset_s']:.1f}",
        )
    Console().print(table)
    for e in evals:
        Console().print(
            f"eval: {e['episodes']} episodes x 220 steps, {e['envs']} envs, {e['image']} px: "
            f"{e['episodes_per_min']:.2f} episodes/min"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": rows, "eval": evals, "host": platform.node(), "cpus": os.cpu_count()}, f, indent=2)


if __name__ == "__main__":
    main()
