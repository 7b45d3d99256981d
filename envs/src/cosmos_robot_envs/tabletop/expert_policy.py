"""``ExpertPolicy``: the scripted experts behind the ``BasePolicy`` interface, so they can be served.

Why: the evaluation runner and the policy server are tested end to end with a policy that really
solves the tasks, without training anything. Served over the network, the expert needs what the
simulator knows, so the client must send ``observation/object_state`` (the env's ``object_state``,
15 floats, from ``obs_mode="all"`` or ``info["object_state"]``) next to ``observation/state``; images
and ``prompt`` may be sent too and are ignored (the task is read from the one-hot in object_state).

Why chunks need a model: a served policy answers ``(H, 7)`` chunks that a client may execute
open-loop. The experts are state feedback, so to produce step ``k + 1`` we predict the state after
step ``k`` with a simple kinematic model of the scene (the hand moves as commanded, fingers close on
a cube between them, a held cube moves with the hand, a pushed cube or a hooked drawer handle is
pushed ahead of the fingers). Replanning every chunk corrects the model's errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec, TextSpec
from cosmos_robot_envs.tabletop.experts import ScriptedExpert, read_expert_inputs, scripted_expert
from cosmos_robot_envs.tabletop.rotations import axis_angle_to_quat, quat_mul, quat_to_axis_angle
from cosmos_robot_envs.tabletop.scene import CUBE_HALF, FINGER_RANGE, HANDLE_OFFSET
from cosmos_robot_envs.tabletop.sim import MAX_POS_STEP, MAX_ROT_STEP
from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_DIM, STATE_DIM, TASK_NAMES, get_task

__all__ = ["ExpertPolicy", "expert_input_spec", "predict_next"]

_PAD = 0.012  # half thickness of the closed finger block


def expert_input_spec() -> InputSpec:
    """What a client must send to a served expert (openpi-style keys; extras such as images allowed)."""
    return InputSpec(
        {
            "observation/state": ArraySpec((STATE_DIM,), "floating"),
            "observation/object_state": ArraySpec((OBJECT_STATE_DIM,), "floating"),
            "prompt": TextSpec(optional=True),
        },
        allow_extra=True,
    )


def predict_next(task: str, state: np.ndarray, obj: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A kinematic guess of ``(state, object_state)`` one 20 Hz step after ``action``."""
    state, obj = state.copy(), obj.copy()
    eef = state[:3] + action[:3] * MAX_POS_STEP
    quat = quat_mul(axis_angle_to_quat(action[3:6] * MAX_ROT_STEP), axis_angle_to_quat(state[3:6]))
    state[3:6] = quat_to_axis_angle(quat)
    lo, hi = FINGER_RANGE
    finger_target = lo + (hi - lo) * (1.0 - float(action[6])) / 2.0
    if task in ("push", "pick_place"):
        offset = obj[0:3] - state[:3]
        between = float(np.linalg.norm(offset[:2])) < 0.02 and abs(offset[2]) < 0.02
        if between and finger_target < CUBE_HALF:
            finger_target = CUBE_HALF - 0.001
            if task == "pick_place":
                obj[0:3] = eef + offset  # carried
        elif task == "push":
            to_goal = obj[7:9] - obj[0:2]
            u = to_goal / max(float(np.linalg.norm(to_goal)), 1e-9)
            rel = eef[:2] - obj[0:2]
            along = float(rel @ u)
            lateral = float(np.linalg.norm(rel - along * u))
            contact = CUBE_HALF + _PAD
            if eef[2] < 2 * CUBE_HALF and lateral < contact and along > -contact:
                obj[0:2] += u * (along + contact)  # pushed ahead of the fingers
    if task == "open_drawer":
        bar_back = obj[0] - 0.006
        face = obj[0] - HANDLE_OFFSET[0]
        if face < eef[0] and eef[0] + _PAD > bar_back and eef[2] < obj[2] and abs(eef[1] - obj[1]) < 0.05:
            pulled = eef[0] + _PAD - bar_back
            obj[0] += pulled
            obj[10] += pulled
    state[:3] = eef
    state[6:8] = finger_target
    return state, obj


class ExpertPolicy(BasePolicy):
    """Answers ``{"actions": (action_horizon, 7)}`` from ``state`` + ``object_state``.

    ``task=None`` serves every tabletop task (read from the one-hot in ``object_state``).
    Accepts env observation keys (``state``, ``object_state``) or wire keys
    (``observation/state``, ``observation/object_state``). ``action_horizon`` (the chunk's rows, our
    ``chunk_size``) keeps the name of the metadata key it announces, as ``-a action_horizon=`` of the
    example policies does (docs/protocol.md, section 7).
    """

    def __init__(self, task: str | None = None, action_horizon: int = 10) -> None:
        if action_horizon < 1:
            raise ValueError(f"action_horizon: expected >= 1, got {action_horizon}")
        self.task = None if task is None else get_task(task).name
        self.action_horizon = action_horizon
        self._experts: dict[str, ScriptedExpert] = {name: scripted_expert(name) for name in TASK_NAMES}

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "policy": type(self).__name__,
            "action_horizon": self.action_horizon,
            "action_dim": 7,
            "tasks": [self.task] if self.task else list(TASK_NAMES),
            "needs": ["observation/state", "observation/object_state"],
        }

    @property
    def input_spec(self) -> InputSpec:
        return expert_input_spec()

    def reset(self) -> None:
        for expert in self._experts.values():
            expert.reset()

    def _task_of(self, obj: np.ndarray) -> str:
        onehot = obj[11 : 11 + len(TASK_NAMES)]
        if self.task is not None:
            return self.task
        if not np.isclose(onehot.sum(), 1.0):
            raise ValueError(f"observation/object_state: entries 11:15 must be a one-hot task id, got {onehot}")
        return TASK_NAMES[int(np.argmax(onehot))]

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        state, obj = read_expert_inputs(obs)
        task = self._task_of(obj)
        expert = self._experts[task]
        actions = np.empty((self.action_horizon, 7), dtype=np.float32)
        for k in range(self.action_horizon):
            actions[k] = expert.act({"state": state, "object_state": obj})
            if k + 1 < self.action_horizon:
                state, obj = predict_next(task, state, obj, actions[k])
        return {"actions": actions}
