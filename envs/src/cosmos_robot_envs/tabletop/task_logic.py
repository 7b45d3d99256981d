"""Per-task initial-state sampling, success predicates, dense shaping and ``object_state``.

Everything is computed from the simulation state, never from the agent's actions, so a policy that
succeeds in a way the expert never does is still scored correctly. Sampling draws only from the
env's seeded generator, so ``reset(seed=s)`` reproduces the same layout.
"""

from __future__ import annotations

import numpy as np

from cosmos_robot_envs.tabletop.scene import BOWL_INNER_RADIUS, BOWL_WALL_TOP, CUBE_HALF, HANDLE_OFFSET
from cosmos_robot_envs.tabletop.sim import Layout, TabletopSim
from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_DIM, TASK_NAMES

__all__ = [
    "DRAWER_SUCCESS_OPENING",
    "PUSH_SUCCESS_DIST",
    "REACH_SUCCESS_DIST",
    "dense_reward",
    "is_success",
    "object_state",
    "sample_layout",
]

REACH_SUCCESS_DIST = 0.03  # m, end-effector to target centre
PUSH_SUCCESS_DIST = 0.04  # m, cube centre to goal centre in the table plane
BOWL_SUCCESS_RADIUS = BOWL_INNER_RADIUS - 0.01  # m, cube centre to bowl centre in the table plane
DRAWER_SUCCESS_OPENING = 0.12  # m of drawer travel


def _uniform(rng: np.random.Generator, low: tuple[float, ...], high: tuple[float, ...]) -> np.ndarray:
    return rng.uniform(np.asarray(low), np.asarray(high))


def sample_layout(task: str, rng: np.random.Generator) -> Layout:
    """A random initial state for ``task``; objects of other tasks are parked out of view."""
    eef = _uniform(rng, (0.0, -0.08, 0.18), (0.12, 0.08, 0.25))
    layout = Layout(eef_pos=eef)
    if task == "reach":
        while True:
            target = _uniform(rng, (-0.15, -0.2, 0.04), (0.2, 0.2, 0.25))
            if np.linalg.norm(target - eef) > 0.08:
                break
        layout.target = target
    elif task == "push":
        while True:
            cube = _uniform(rng, (-0.1, -0.15), (0.15, 0.15))
            angle = rng.uniform(-np.pi, np.pi)
            goal = cube + rng.uniform(0.1, 0.18) * np.array([np.cos(angle), np.sin(angle)])
            if -0.15 <= goal[0] <= 0.2 and abs(goal[1]) <= 0.2:
                break
        layout.blue_cube = (float(cube[0]), float(cube[1]), float(rng.uniform(-np.pi / 4, np.pi / 4)))
        layout.goal = np.array([goal[0], goal[1], 0.0])
    elif task == "pick_place":
        while True:
            cube = _uniform(rng, (-0.1, -0.18), (0.15, 0.18))
            bowl = _uniform(rng, (-0.12, -0.2), (0.15, 0.2))
            if np.linalg.norm(cube - bowl) > 0.16:
                break
        layout.red_cube = (float(cube[0]), float(cube[1]), float(rng.uniform(-np.pi / 4, np.pi / 4)))
        layout.bowl = np.array([bowl[0], bowl[1], 0.0])
    elif task == "open_drawer":
        front = _uniform(rng, (-0.12, -0.15), (-0.06, 0.15))
        layout.cabinet = np.array([front[0], front[1], 0.0])
        layout.drawer_opening = float(rng.uniform(0.0, 0.02))
    else:
        raise ValueError(f"task: unknown tabletop task {task!r}; known tasks: {', '.join(TASK_NAMES)}")
    return layout


def object_state(task: str, sim: TabletopSim) -> np.ndarray:
    """The 15-D task-relevant state; layout documented in ``tasks.py``."""
    out = np.zeros(OBJECT_STATE_DIM, dtype=np.float64)
    out[3] = 1.0  # identity quaternion unless a cube overrides it
    if task == "reach":
        out[0:3] = out[7:10] = sim.mocap_pos("target")
    elif task == "push":
        out[0:3], out[3:7] = sim.cube_pose("blue_cube")
        out[7:10] = sim.mocap_pos("goal")
    elif task == "pick_place":
        out[0:3], out[3:7] = sim.cube_pose("red_cube")
        out[7:10] = sim.mocap_pos("bowl")
    elif task == "open_drawer":
        opening = sim.drawer_opening()
        out[0:3] = sim.handle_pos()
        out[7:10] = sim.mocap_pos("cabinet") + HANDLE_OFFSET + [DRAWER_SUCCESS_OPENING, 0.0, 0.0]
        out[10] = opening
    out[11 + TASK_NAMES.index(task)] = 1.0
    return out.astype(np.float32)


def is_success(task: str, sim: TabletopSim) -> bool:
    if task == "reach":
        return bool(np.linalg.norm(sim.eef_pos() - sim.mocap_pos("target")) < REACH_SUCCESS_DIST)
    if task == "push":
        cube, _ = sim.cube_pose("blue_cube")
        on_table = cube[2] < CUBE_HALF + 0.01
        return bool(on_table and np.linalg.norm(cube[:2] - sim.mocap_pos("goal")[:2]) < PUSH_SUCCESS_DIST)
    if task == "pick_place":
        cube, _ = sim.cube_pose("red_cube")
        inside = np.linalg.norm(cube[:2] - sim.mocap_pos("bowl")[:2]) < BOWL_SUCCESS_RADIUS and cube[2] < BOWL_WALL_TOP
        return bool(inside and not sim.touching(sim.finger_geoms, sim.cube_geoms["red_cube"]))
    if task == "open_drawer":
        return sim.drawer_opening() >= DRAWER_SUCCESS_OPENING
    raise ValueError(f"task: unknown tabletop task {task!r}")


def _closeness(distance: float) -> float:
    """1 at zero distance, ~0.24 at 10 cm: a smooth shaping term."""
    return float(1.0 - np.tanh(10.0 * distance))


def dense_reward(task: str, sim: TabletopSim, success: bool | None = None) -> float:
    """Shaping in [0, 1] (1 on success), reported as ``info["dense_reward"]``; not the env reward."""
    if is_success(task, sim) if success is None else success:
        return 1.0
    eef = sim.eef_pos()
    if task == "reach":
        return _closeness(float(np.linalg.norm(eef - sim.mocap_pos("target"))))
    if task == "push":
        cube, _ = sim.cube_pose("blue_cube")
        to_goal = float(np.linalg.norm(cube[:2] - sim.mocap_pos("goal")[:2]))
        return 0.3 * _closeness(float(np.linalg.norm(eef - cube))) + 0.7 * _closeness(to_goal)
    if task == "pick_place":
        cube, _ = sim.cube_pose("red_cube")
        above_bowl = sim.mocap_pos("bowl") + [0.0, 0.0, 0.03]
        return 0.3 * _closeness(float(np.linalg.norm(eef - cube))) + 0.6 * _closeness(
            float(np.linalg.norm(cube - above_bowl))
        )
    if task == "open_drawer":
        hook = sim.handle_pos() - [0.025, 0.0, 0.01]
        opened = min(1.0, sim.drawer_opening() / DRAWER_SUCCESS_OPENING)
        return 0.3 * _closeness(float(np.linalg.norm(eef - hook))) + 0.6 * opened
    raise ValueError(f"task: unknown tabletop task {task!r}")
