"""Scripted experts: the demonstration source for SFT and the oracle the tests trust.

Why state feedback without memory: each action is a function of the current ``state`` (8-D proprio)
and ``object_state`` (15-D) alone, so an expert survives replanning at any rate, action chunks
executed open-loop, a slipped grasp or a nudged cube: the phase (approach, descend, grasp, carry,
release) is read off the scene each step instead of being remembered. The same code therefore drives
the env directly (``act``), and serves chunks over the network (``ExpertPolicy``).

Actions are LIBERO-style deltas in [-1, 1]: speeds stay below ``MAX_SPEED`` (0.75 of the action
range), rotations keep the fingers pointing down and turn the hand about the vertical to match the
cube, and the gripper command is -1 (open) or +1 (close).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cosmos_robot_envs.tabletop.rotations import (
    axis_angle_to_quat,
    quat_conj,
    quat_mul,
    quat_to_axis_angle,
    yaw_of,
    yaw_quat,
)
from cosmos_robot_envs.tabletop.scene import CUBE_HALF, HANDLE_OFFSET
from cosmos_robot_envs.tabletop.sim import MAX_POS_STEP, MAX_ROT_STEP
from cosmos_robot_envs.tabletop.task_logic import DRAWER_SUCCESS_OPENING
from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_DIM, STATE_DIM, TASK_NAMES, get_task

__all__ = ["MAX_SPEED", "ScriptedExpert", "read_expert_inputs", "scripted_expert"]

MAX_SPEED = 0.015  # m per step the experts ask for (0.75 of MAX_POS_STEP)
OPEN, CLOSE = -1.0, 1.0
HOVER_Z = 0.10  # end-effector height for moving above objects
CARRY_Z = 0.13
GRASP_XY_TOL = 0.008
# the hand over the bowl centre within this (xy) releases the cube: the cube then lands well inside the
# 5.4 cm success radius, and the release is a decision an image policy can read from 64 px (with a 6 mm
# tolerance, policies that localise the bowl to ~1 cm hovered over it holding the cube until time ran out)
RELEASE_XY_TOL = 0.015
_FINGER_PAD = 0.012  # half thickness of the closed finger block around the end-effector


def read_expert_inputs(obs: Mapping[str, Any], info: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(state, object_state)`` from an env observation, a wire observation or an env ``info``."""
    found: dict[str, np.ndarray] = {}
    for key, dim in (("state", STATE_DIM), ("object_state", OBJECT_STATE_DIM)):
        for source in (obs, info or {}):
            for name in (key, f"observation/{key}"):
                if name in source:
                    found[key] = np.asarray(source[name], dtype=np.float64).reshape(-1)
                    break
            if key in found:
                break
        if key not in found:
            raise KeyError(
                f"{key}: the scripted expert needs '{key}' (or 'observation/{key}') in the observation or info; "
                "use obs_mode='state' or 'all', or pass the env's info (it always carries object_state)"
            )
        if found[key].shape != (dim,):
            raise ValueError(f"{key}: expected shape ({dim},), got {found[key].shape}")
    return found["state"], found["object_state"]


def _move(eef: np.ndarray, target: ArrayLike, speed: float = MAX_SPEED) -> np.ndarray:
    delta = np.asarray(target, dtype=np.float64) - eef
    norm = float(np.linalg.norm(delta))
    if norm > speed:
        delta *= speed / norm
    return delta / MAX_POS_STEP


def _turn_to_yaw(axis_angle: np.ndarray, yaw: float) -> np.ndarray:
    """Rotation action that brings the hand to fingers-down with heading ``yaw`` (world-frame error)."""
    error = quat_to_axis_angle(quat_mul(yaw_quat(yaw), quat_conj(axis_angle_to_quat(axis_angle))))
    return np.clip(0.7 * error / MAX_ROT_STEP, -0.75, 0.75)


def _grasp_yaw(cube_quat: np.ndarray, hand_yaw: float) -> float:
    """The cube heading nearest the hand's, modulo the cube's quarter-turn symmetry."""
    quarter = np.pi / 2
    offset = (yaw_of(cube_quat) - hand_yaw + quarter / 2) % quarter - quarter / 2
    return hand_yaw + offset


class ScriptedExpert:
    """Base class: ``reset(...)`` between episodes, ``act(obs, info=None) -> (7,) float32``."""

    task = ""

    def reset(self, source: Any = None) -> None:
        """Nothing to clear (the experts keep no memory); accepts an env or an info dict for symmetry."""

    def act(self, obs: Mapping[str, Any], info: Mapping[str, Any] | None = None) -> np.ndarray:
        state, obj = read_expert_inputs(obs, info)
        return np.clip(self.compute(state, obj), -1.0, 1.0).astype(np.float32)

    def compute(self, state: np.ndarray, obj: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def _action(pos: np.ndarray, rot: np.ndarray | None = None, gripper: float = OPEN) -> np.ndarray:
        return np.concatenate([pos, np.zeros(3) if rot is None else rot, [gripper]])


class ReachExpert(ScriptedExpert):
    task = "reach"

    def compute(self, state: np.ndarray, obj: np.ndarray) -> np.ndarray:
        return self._action(_move(state[:3], obj[0:3]), _turn_to_yaw(state[3:6], 0.0), OPEN)


class PushExpert(ScriptedExpert):
    """Get behind the cube on the goal line at a safe height, drop down, push along the line."""

    task = "push"
    push_z = CUBE_HALF  # end-effector height while pushing (fingertips 1 cm above the table)
    standoff = CUBE_HALF + _FINGER_PAD + 0.02

    def compute(self, state: np.ndarray, obj: np.ndarray) -> np.ndarray:
        eef, cube, goal = state[:3], obj[0:3], obj[7:10]
        rot = _turn_to_yaw(state[3:6], 0.0)
        to_goal = goal[:2] - cube[:2]
        dist = float(np.linalg.norm(to_goal))
        if dist < 0.01:
            return self._action(_move(eef, [eef[0], eef[1], HOVER_Z]), rot, CLOSE)
        u = to_goal / dist
        rel = eef[:2] - cube[:2]
        along = float(rel @ u)
        lateral = float(np.linalg.norm(rel - along * u))
        contact = CUBE_HALF + _FINGER_PAD
        if along < -(contact - 0.006) and lateral < 0.015 and eef[2] < self.push_z + 0.015:
            # pushing: advance along the line, steering back onto it
            line_point = cube[:2] - u * contact
            steer = line_point - eef[:2]
            steer -= (steer @ u) * u
            speed = min(0.012, 0.004 + 0.5 * dist)
            xy = eef[:2] + u * speed + 0.6 * steer
            return self._action(_move(eef, [xy[0], xy[1], self.push_z]), rot, CLOSE)
        pre = cube[:2] - u * self.standoff
        if float(np.linalg.norm(eef[:2] - pre)) < 0.008:
            return self._action(_move(eef, [pre[0], pre[1], self.push_z]), rot, CLOSE)
        if eef[2] < HOVER_Z - 0.02 and float(np.linalg.norm(rel)) < self.standoff + 0.03:
            return self._action(_move(eef, [eef[0], eef[1], HOVER_Z]), rot, CLOSE)  # clear the cube first
        height = HOVER_Z if float(np.linalg.norm(eef[:2] - pre)) > 0.03 else eef[2]
        return self._action(_move(eef, [pre[0], pre[1], height]), rot, CLOSE)


class PickPlaceExpert(ScriptedExpert):
    """Align heading, descend, close, lift, carry over the bowl, lower, open."""

    task = "pick_place"

    def compute(self, state: np.ndarray, obj: np.ndarray) -> np.ndarray:
        eef, aa, fingers = state[:3], state[3:6], state[6:8]
        cube, cube_quat, bowl = obj[0:3], obj[3:7], obj[7:10]
        hand_yaw = yaw_of(axis_angle_to_quat(aa))
        grip = float(fingers.mean())
        offset = cube - eef
        in_hand = float(np.linalg.norm(offset[:2])) < 0.02 and abs(offset[2]) < 0.02
        holding = in_hand and CUBE_HALF - 0.008 < grip < CUBE_HALF + 0.01
        cube_over_bowl = float(np.linalg.norm(cube[:2] - bowl[:2])) < 0.05
        if cube_over_bowl and not holding:
            # released (or dropping): open and back off upwards
            return self._action(_move(eef, [eef[0], eef[1], CARRY_Z]), None, OPEN)
        if holding:
            to_bowl = bowl[:2] - eef[:2]
            if eef[2] < CARRY_Z - 0.03 and float(np.linalg.norm(to_bowl)) > 0.02:
                return self._action(_move(eef, [eef[0], eef[1], CARRY_Z]), None, CLOSE)  # lift first
            if float(np.linalg.norm(to_bowl)) > RELEASE_XY_TOL:
                return self._action(_move(eef, [bowl[0], bowl[1], CARRY_Z]), None, CLOSE)
            if eef[2] > 0.095:
                return self._action(_move(eef, [bowl[0], bowl[1], 0.09]), None, CLOSE)
            return self._action(np.zeros(3), None, OPEN)
        yaw = _grasp_yaw(cube_quat, hand_yaw)
        rot = _turn_to_yaw(aa, yaw)
        xy_err = float(np.linalg.norm(offset[:2]))
        yaw_ok = abs(yaw - hand_yaw) < 0.08
        if xy_err < GRASP_XY_TOL and yaw_ok:
            if eef[2] - cube[2] < 0.006:
                return self._action(_move(eef, cube), rot, CLOSE)
            return self._action(_move(eef, cube), rot, OPEN)
        if eef[2] < cube[2] + 0.04 and xy_err > 0.015:
            return self._action(_move(eef, [eef[0], eef[1], HOVER_Z]), rot, OPEN)  # clear the cube first
        height = HOVER_Z if xy_err > 0.02 else eef[2]
        return self._action(_move(eef, [cube[0], cube[1], height]), rot, OPEN)


class OpenDrawerExpert(ScriptedExpert):
    """Lower the closed fingers between the drawer front and the handle bar, then pull."""

    task = "open_drawer"
    hook_offset = np.array([-HANDLE_OFFSET[0] / 2, 0.0, -0.012])  # eef relative to the handle bar centre

    def compute(self, state: np.ndarray, obj: np.ndarray) -> np.ndarray:
        eef, handle, opening = state[:3], obj[0:3], float(obj[10])
        rot = _turn_to_yaw(state[3:6], 0.0)
        hook = handle + self.hook_offset
        if opening >= DRAWER_SUCCESS_OPENING + 0.01:
            return self._action(np.zeros(3), rot, CLOSE)
        face_x = handle[0] - HANDLE_OFFSET[0]
        in_hook = face_x + 0.01 < eef[0] < handle[0] and abs(eef[1] - hook[1]) < 0.03 and eef[2] < handle[2]
        if in_hook:
            target = [eef[0] + 0.012, hook[1], hook[2]]
            return self._action(_move(eef, target), rot, CLOSE)
        xy_err = float(np.linalg.norm(hook[:2] - eef[:2]))
        if xy_err < 0.006:
            return self._action(_move(eef, hook), rot, CLOSE)
        above = handle[2] + 0.06
        if eef[2] < above - 0.02 and xy_err > 0.015:
            return self._action(_move(eef, [eef[0], eef[1], above]), rot, CLOSE)
        height = above if xy_err > 0.02 else eef[2]
        return self._action(_move(eef, [hook[0], hook[1], height]), rot, CLOSE)


_EXPERTS: dict[str, type[ScriptedExpert]] = {
    cls.task: cls for cls in (ReachExpert, PushExpert, PickPlaceExpert, OpenDrawerExpert)
}
assert set(_EXPERTS) == set(TASK_NAMES)


def scripted_expert(task: str) -> ScriptedExpert:
    """The expert for ``task`` (a name from ``TASKS``)."""
    return _EXPERTS[get_task(task).name]()
