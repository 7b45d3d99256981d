"""Can a 64 px agent view tell a reach target's height? Pixels that separate two targets on one camera ray.

Why: the reach target floats 4-25 cm above the table. Without a height cue, two targets on the same
agent-camera ray project to (almost) the same image: the far, low one and the near, high one differ
only in the sphere's apparent size. ``scene.py`` therefore draws a drop-shadow disc on the table below
the target and a stem from the disc up to the sphere (visual only). This script measures what that cue
buys and what it costs:

  1. pixel separation: for a few low targets, the target 17.8 cm further up the ray towards the agent
     camera (the ray comes from the camera pose in the compiled model, ``cam_xpos``/``cam_xmat``; both
     targets lie in reach's sampling box and project to the same pixel); the two layouts (same gripper
     pose) are rendered at 64 px and the number of agent-view pixels that differ in any channel is
     counted, without the cue (its geoms hidden by setting their alpha to 0, which MuJoCo skips when it
     builds the scene) and with it;
  2. render cost: ``env.step`` steps/s with ``obs_mode="rgb"`` (both cameras) at 128 and 64 px, random
     actions, without and with the cue; runs alternate and the best of ``--repeats`` is kept, since the
     2-core box is shared.

    MUJOCO_GL=egl .venv/bin/python benchmarks/reach_observability.py [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
import numpy as np

from cosmos_robot_envs.tabletop import TabletopEnv, make_env
from cosmos_robot_envs.tabletop.sim import Layout

SEPARATION = 0.178  # m along the ray, as in the diagnosis that found the problem
CUE_GEOMS = ("target_stem", "target_shadow")
EEF = np.array([0.12, -0.08, 0.25])  # one gripper pose for every layout, off to the side
# low targets (m); the high partner lies SEPARATION further along the ray towards the camera
LOW_TARGETS = [(-0.10, 0.05, 0.05), (0.1, -0.15, 0.04), (0.0, 0.15, 0.04), (-0.05, -0.05, 0.06), (0.05, 0.1, 0.04)]
REACH_BOX = (np.array([-0.15, -0.2, 0.04]), np.array([0.2, 0.2, 0.25]))  # task_logic.sample_layout's range


def set_cue(env: TabletopEnv, visible: bool) -> None:
    """Show or hide the height cue by its geoms' alpha (an alpha-0 geom is not drawn at all)."""
    for name in CUE_GEOMS:
        env.sim.model.geom_rgba[env.sim.model.geom(name).id, 3] = 1.0 if visible else 0.0


def camera_pose(env: TabletopEnv) -> tuple[np.ndarray, np.ndarray]:
    """The agent camera's world position and rotation (columns: right, up, backwards)."""
    m, d = env.sim.model, env.sim.data
    mujoco.mj_forward(m, d)
    cam = m.camera("agentview").id
    return d.cam_xpos[cam].copy(), d.cam_xmat[cam].reshape(3, 3).copy()


def project(env: TabletopEnv, cam_pos: np.ndarray, cam_mat: np.ndarray, point: np.ndarray) -> tuple[float, float]:
    """(row, col) of ``point`` in the upright agent view."""
    h, w = env.image_hw
    x, y, z = cam_mat.T @ (point - cam_pos)  # camera frame: looks along -z
    f = (h / 2) / np.tan(np.deg2rad(env.sim.model.cam_fovy[env.sim.model.camera("agentview").id]) / 2)
    return h / 2 - f * y / -z, w / 2 + f * x / -z


def render_layout(env: TabletopEnv, target: np.ndarray) -> np.ndarray:
    env.sim.reset(Layout(eef_pos=EEF.copy(), target=np.asarray(target, dtype=np.float64)))
    return env.render_camera("agentview")


def pixel_separation(size: int = 64) -> list[dict[str, object]]:
    env = make_env("reach", image_size=size)
    rows: list[dict[str, object]] = []
    try:
        env.reset(seed=0)
        cam_pos, cam_mat = camera_pose(env)
        for low in LOW_TARGETS:
            low = np.array(low)
            up_ray = (cam_pos - low) / np.linalg.norm(cam_pos - low)
            high = low + SEPARATION * up_ray
            assert np.all(high >= REACH_BOX[0]) and np.all(high <= REACH_BOX[1]), high
            pix_low, pix_high = project(env, cam_pos, cam_mat, low), project(env, cam_pos, cam_mat, high)
            assert np.allclose(pix_low, pix_high, atol=1e-6), (pix_low, pix_high)
            row: dict[str, object] = {"low": low, "high": high, "pixel": pix_low}
            for label, visible in (("before", False), ("after", True)):
                set_cue(env, visible)
                a, b = render_layout(env, low), render_layout(env, high)
                row[label] = int(np.any(a != b, axis=-1).sum())
            rows.append(row)
    finally:
        env.close()
    return rows


def steps_per_s(size: int, visible: bool, steps: int) -> float:
    env = make_env("reach", obs_mode="rgb", image_size=size)
    rng = np.random.default_rng(0)
    try:
        set_cue(env, visible)
        env.reset(seed=0)
        for _ in range(10):  # warm-up (the first render creates the GL context)
            env.step(rng.uniform(-1, 1, 7))
        start = time.perf_counter()
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, 7))
            if terminated or truncated:
                env.reset()
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="timed env steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs per setting; the best is kept")
    args = parser.parse_args()

    rows = pixel_separation(64)
    print(f"agent-view pixels (of {64 * 64}) that differ between two reach targets {SEPARATION * 100:.1f} cm apart")
    print("on one camera ray, 64 px, same gripper pose:")
    print(f"{'low target (m)':>22} {'high target (m)':>22} {'pixel (r, c)':>14} {'no cue':>7} {'cue':>6}")
    for r in rows:
        low, high, pix = r["low"], r["high"], r["pixel"]
        print(
            f"{np.array2string(low, precision=3):>22} {np.array2string(high, precision=3):>22} "  # type: ignore[arg-type]
            f"{f'({pix[0]:.1f}, {pix[1]:.1f})':>14} {r['before']:>7} {r['after']:>6}"  # type: ignore[index]
        )
    before = [int(r["before"]) for r in rows]  # type: ignore[call-overload]
    after = [int(r["after"]) for r in rows]  # type: ignore[call-overload]
    print(f"{'mean':>61} {np.mean(before):>7.1f} {np.mean(after):>6.1f}")

    best_of = f"best of {args.repeats} x {args.steps} steps"
    print(f"\nenv.step steps/s, obs_mode='rgb' (agent view + wrist), reach, {best_of}:")
    print(f"{'size':>5} {'no cue':>8} {'cue':>8} {'change':>8} {'us/px no cue':>13} {'us/px cue':>10}")
    for size in (128, 64):
        best = {False: 0.0, True: 0.0}
        for _ in range(args.repeats):
            for visible in (False, True):
                best[visible] = max(best[visible], steps_per_s(size, visible, args.steps))
        per_px = {v: 1e6 / best[v] / (2 * size * size) for v in best}  # both cameras
        print(
            f"{size:>5} {best[False]:>8.1f} {best[True]:>8.1f} {100 * (best[True] / best[False] - 1):>+7.1f}% "
            f"{per_px[False]:>13.3f} {per_px[True]:>10.3f}"
        )


if __name__ == "__main__":
    main()
