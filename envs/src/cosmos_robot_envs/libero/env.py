"""``Libero/Libero-v0``: one LIBERO suite as a gymnasium env that can run any of its tasks.

The evaluation protocol of openpi and LeRobot, built in so every caller gets it right:

- ``reset(seed, options={"task": name, "init_state": i})`` loads the task's fixed benchmark initial
  state ``i`` (episode ``i`` of the standard protocol uses state ``i``; without options the seed
  picks both), then takes ``settle_steps`` (10) no-op steps with the gripper open so the objects
  come to rest; the settle steps do not count toward the suite's ``max_steps``
  (220/280/300/520/400 for spatial/object/goal/10/90);
- observations: ``image`` (agent view) and ``wrist_image`` (eye-in-hand), uint8, rotated 180
  degrees so they are upright (robosuite renders them upside down); ``state`` float32 (8,) =
  end-effector position, its orientation as axis-angle, the two gripper finger joints; ``prompt``
  = the task's language instruction;
- actions: float32 (7,) OSC_POSE deltas ``[dpos(3), drot(3), gripper]`` in [-1, 1] (gripper -1
  opens, +1 closes), LIBERO's own controller;
- ``terminated`` when the task's BDDL goal predicates hold (``info["is_success"]``, reward 1);
  ``truncated`` at ``max_steps``.

Several tasks in one env: the robosuite env of each task is built on first use and the most recent
``cache_size`` are kept, so a slot of the evaluator that alternates tasks does not rebuild its scene
every episode. The MuJoCo/EGL context is created inside the process that steps the env (the
vector layer's worker), never inherited through ``fork``.

This module imports LIBERO lazily; it runs in the LIBERO venv (see :mod:`.catalog`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from cosmos_robot_envs.libero.catalog import SUITE_MAX_STEPS, get_task, load_init_states, prepare, suite_tasks
from cosmos_robot_envs.libero.state import libero_state
from cosmos_robot_envs.tabletop.env import PROMPT_CHARSET

__all__ = ["SETTLE_ACTION", "LiberoEnv"]

SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # stay put, gripper open
CAMERAS = ("agentview", "robot0_eye_in_hand")


class LiberoEnv(gym.Env[dict[str, Any], np.ndarray]):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        suite: str = "libero_spatial",
        tasks: list[str] | None = None,
        image_size: int = 256,
        max_steps: int | None = None,
        settle_steps: int = 10,
        cache_size: int = 2,
        render_mode: str | None = None,
    ) -> None:
        if suite not in SUITE_MAX_STEPS:
            raise ValueError(f"suite: unknown LIBERO suite {suite!r}; known: {', '.join(SUITE_MAX_STEPS)}")
        for name, value in (("image_size", image_size), ("cache_size", cache_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if settle_steps < 0:
            raise ValueError(f"settle_steps: expected >= 0, got {settle_steps}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: expected None or 'rgb_array', got {render_mode!r}")
        prepare()
        known = suite_tasks(suite)
        self._tasks = list(tasks) if tasks else known
        unknown = [t for t in self._tasks if t not in known]
        if unknown:
            raise ValueError(f"tasks: {unknown} are not tasks of {suite!r}; its tasks: {known}")
        self.suite, self.image_size, self.settle_steps = suite, image_size, settle_steps
        self.max_steps = max_steps or SUITE_MAX_STEPS[suite]
        self.cache_size, self.render_mode = cache_size, render_mode
        image = spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(
            {
                "image": image,
                "wrist_image": image,
                "state": spaces.Box(-np.inf, np.inf, (8,), np.float32),
                "prompt": spaces.Text(max_length=256, charset=PROMPT_CHARSET),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
        self._envs: OrderedDict[str, Any] = OrderedDict()
        self._init_states: dict[str, np.ndarray] = {}
        self._task: str | None = None
        self._steps = 0
        self._last: dict[str, Any] | None = None

    # -- gymnasium API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = sorted(set(options) - {"task", "init_state"})
        if unknown:
            raise ValueError(f"options: unknown key(s) {unknown}; known: 'task', 'init_state'")
        task = str(options["task"]) if "task" in options else str(self.np_random.choice(self._tasks))
        if task not in self._tasks:
            raise ValueError(f"options['task']: {task!r} is not among this env's tasks {self._tasks}")
        states = self._states(task)
        index = int(options["init_state"]) if "init_state" in options else int(self.np_random.integers(len(states)))
        if not 0 <= index < len(states):
            raise ValueError(f"options['init_state']: {index} is out of range; {task!r} has {len(states)} states")
        env = self._env(task)
        if seed is not None:
            env.seed(int(seed))
        env.reset()
        raw = env.set_init_state(states[index])
        for _ in range(self.settle_steps):
            raw, _, _, _ = env.step(SETTLE_ACTION)
        self._task, self._steps = task, 0
        obs = self._obs(raw, task)
        return obs, {"task": task, "init_state": index, "is_success": False}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        act = np.asarray(action, dtype=np.float64)
        if act.shape != (7,):
            raise ValueError(f"action: expected shape (7,) [dpos(3), drot(3), gripper], got {act.shape}")
        if not np.all(np.isfinite(act)):
            raise ValueError(f"action: expected finite values, got {act.tolist()}")
        env = self._envs[self._task]
        raw, _, done, _ = env.step(np.clip(act, -1.0, 1.0))
        self._steps += 1
        success = bool(done) or bool(env.check_success())
        obs = self._obs(raw, self._task)
        truncated = not success and self._steps >= self.max_steps
        info = {"task": self._task, "is_success": success}
        return obs, float(success), success, truncated, info

    def render(self) -> np.ndarray | None:
        return None if self._last is None else np.array(self._last["image"])

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()

    # -- pieces ------------------------------------------------------------------------------------
    def _states(self, task: str) -> np.ndarray:
        if task not in self._init_states:
            self._init_states[task] = load_init_states(get_task(self.suite, task).init_states_file)
        return self._init_states[task]

    def _env(self, task: str) -> Any:
        if task in self._envs:
            self._envs.move_to_end(task)
            return self._envs[task]
        from libero.libero.envs import OffScreenRenderEnv

        while len(self._envs) >= self.cache_size:
            _, old = self._envs.popitem(last=False)
            old.close()
        self._envs[task] = env = OffScreenRenderEnv(
            bddl_file_name=str(get_task(self.suite, task).bddl_file),
            camera_heights=self.image_size,
            camera_widths=self.image_size,
            camera_names=list(CAMERAS),
        )
        return env

    def _obs(self, raw: dict[str, Any], task: str) -> dict[str, Any]:
        obs = {
            "image": np.ascontiguousarray(raw["agentview_image"][::-1, ::-1]),
            "wrist_image": np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1]),
            "state": libero_state(raw["robot0_eef_pos"], raw["robot0_eef_quat"], raw["robot0_gripper_qpos"]),
            "prompt": get_task(self.suite, task).language,
        }
        self._last = obs
        return obs
