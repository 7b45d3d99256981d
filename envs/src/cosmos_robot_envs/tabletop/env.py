"""``TabletopEnv``: the embedded MuJoCo suite behind a LIBERO-like Gymnasium interface.

Why LIBERO-like: the policies this project serves (pi0.5, GR00T, our flow models) are trained on
LIBERO's contract, so the default CPU suite speaks it too: a 7-D delta end-effector action in
[-1, 1] at 20 Hz (gripper -1 open / +1 close), an agent-view and a wrist camera, an 8-D state
(eef position, eef axis-angle, two finger openings) and the instruction as ``prompt``. Unlike
LIBERO's raw renders, images are upright.

Observation modes (``obs_mode``):

- ``"rgb"`` (default): ``image``, ``wrist_image`` (uint8 HxWx3), ``state`` (float32 (8,)), ``prompt``;
- ``"state"``: ``state``, ``object_state`` (float32 (15,), see ``tasks.py``) and ``prompt``; renders
  nothing, for fast RL and for the scripted experts (a camera-free multi-task policy still needs the
  instruction, so every mode carries ``prompt``);
- ``"all"``: both of the above (what an eval needs to serve the experts as a policy).

``info`` always carries ``task``, ``is_success``, ``dense_reward`` (shaping in [0, 1]) and
``object_state``. The reward is sparse: 1.0 on the step that succeeds, else 0.0. An episode terminates
on success and truncates at the task's ``max_steps`` (or the ``max_steps`` argument); the env does it
itself rather than through ``TimeLimit`` because the multi-task env's ``max_steps`` changes per episode.

Vectorising: the project's vector layer (``cosmos_robot_envs.vector``) carries ``prompt`` correctly.
gymnasium 1.4's own ``AsyncVectorEnv`` with ``shared_memory=True`` does not (it reads Text observations
from shared memory once, at construction, so every prompt comes back blank); pass
``vector_kwargs={"shared_memory": False}`` to ``gym.make_vec`` (every obs mode carries ``prompt``).

Rendering targets software GL: no shadows, no reflections, no skybox, an offscreen buffer the size of
the image, and one ``mujoco.Renderer`` created on first use and shared by both cameras. Call
``close()`` to release its EGL context.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from cosmos_robot_envs.tabletop.sim import CONTROL_HZ, TabletopSim
from cosmos_robot_envs.tabletop.task_logic import dense_reward, is_success, object_state, sample_layout
from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_DIM, STATE_DIM, TASK_NAMES, TaskSpec, get_task

__all__ = ["ACTION_DIM", "OBS_MODES", "TabletopEnv"]

ACTION_DIM = 7
OBS_MODES = ("rgb", "state", "all")
PROMPT_CHARSET = frozenset(string.ascii_letters + string.digits + " ,.'-")
_ACTION_LAYOUT = "[dx, dy, dz, dax, day, daz, gripper]"
# Finite observation bounds (metres, radians): generous, and values are clipped to them so a cube
# knocked onto the floor still yields an observation inside the declared space.
STATE_HIGH = np.array([1.0, 1.0, 1.0, 3.2, 3.2, 3.2, 0.1, 0.1], dtype=np.float32)
OBJECT_STATE_HIGH = np.array([2.0] * 3 + [1.0] * 4 + [2.0] * 3 + [0.5] + [1.0] * 4, dtype=np.float32)


def _image_hw(image_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(image_size, (int, np.integer)):
        hw = (int(image_size), int(image_size))
    else:
        size = tuple(int(v) for v in image_size)
        if len(size) != 2:
            raise ValueError(f"image_size: expected an int or (height, width), got {image_size!r}")
        hw = (size[0], size[1])
    if min(hw) < 8 or max(hw) > 2048:
        raise ValueError(f"image_size: each side must be in [8, 2048] pixels, got {hw}")
    return hw


class TabletopEnv(gym.Env[dict[str, Any], np.ndarray]):
    """One task (``task="push"``) or a multi-task env (``task=None``; pick per episode with
    ``reset(options={"task": name})``, else sampled uniformly from ``tasks`` with the env's seed)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": CONTROL_HZ}

    def __init__(
        self,
        task: str | None = None,
        *,
        tasks: Sequence[str] | None = None,
        obs_mode: str = "rgb",
        image_size: int | Sequence[int] = 128,
        render_mode: str | None = None,
        max_steps: int | None = None,
    ) -> None:
        if obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode: expected one of {OBS_MODES}, got {obs_mode!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode: expected None or 'rgb_array', got {render_mode!r}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps: expected a positive int or None, got {max_steps!r}")
        if task is not None:
            if tasks is not None:
                raise ValueError("tasks: give either task (one-task env) or tasks (multi-task env), not both")
            self._tasks: tuple[str, ...] = (get_task(task).name,)
        else:
            self._tasks = tuple(get_task(t).name for t in (tasks if tasks is not None else TASK_NAMES))
            if not self._tasks:
                raise ValueError("tasks: expected at least one task name")
        self.multitask = task is None
        self.obs_mode = obs_mode
        self.render_mode = render_mode
        self.image_hw = _image_hw(image_size)
        self._max_steps_override = max_steps
        self.sim = TabletopSim(*self.image_hw)
        self._renderer: mujoco.Renderer | None = None
        self._agentview: np.ndarray | None = None  # the current state's agent view, if rendered
        self._task = self._tasks[0]
        self._steps = 0

        self.action_space = spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)
        obs: dict[str, spaces.Space[Any]] = {}
        if obs_mode in ("rgb", "all"):
            image = spaces.Box(0, 255, shape=(*self.image_hw, 3), dtype=np.uint8)
            obs["image"] = image
            obs["wrist_image"] = image
        obs["state"] = spaces.Box(-STATE_HIGH, STATE_HIGH, shape=(STATE_DIM,), dtype=np.float32)
        if obs_mode in ("state", "all"):
            obs["object_state"] = spaces.Box(
                -OBJECT_STATE_HIGH, OBJECT_STATE_HIGH, shape=(OBJECT_STATE_DIM,), dtype=np.float32
            )
        obs["prompt"] = spaces.Text(max_length=128, charset=PROMPT_CHARSET)
        self.observation_space = spaces.Dict(obs)

    # ------------------------------------------------------------------ task facts
    @property
    def task(self) -> str:
        """The current episode's task name."""
        return self._task

    @property
    def task_spec(self) -> TaskSpec:
        return get_task(self._task)

    @property
    def tasks(self) -> tuple[str, ...]:
        return self._tasks

    @property
    def prompt(self) -> str:
        return self.task_spec.instruction

    @property
    def max_steps(self) -> int:
        """The episode length at which the current episode truncates, in 20 Hz steps."""
        return self._max_steps_override or self.task_spec.max_steps

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = sorted(set(options) - {"task"})
        if unknown:
            raise ValueError(f"options: unknown key(s) {unknown}; the only option is 'task'")
        if "task" in options:
            name = get_task(str(options["task"])).name
            if name not in self._tasks:
                kind = "this one-task env" if not self.multitask else "this env's tasks"
                raise ValueError(f"options['task']: {name!r} is not in {kind} {list(self._tasks)}")
            self._task = name
        elif self.multitask:
            self._task = self._tasks[int(self.np_random.integers(len(self._tasks)))]
        self.sim.reset(sample_layout(self._task, self.np_random))
        self._steps = 0
        return self._observe()

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self.sim.apply_action(self._validate_action(action))
        self._steps += 1
        obs, info = self._observe()
        success = bool(info["is_success"])
        truncated = not success and self._steps >= self.max_steps
        return obs, float(success), success, truncated, info

    def render(self) -> np.ndarray | None:
        """The agent-view camera (upright RGB, the observation's size) when ``render_mode='rgb_array'``."""
        if self.render_mode is None:
            gym.logger.warn("render() called with render_mode=None; pass render_mode='rgb_array' to the env")
            return None
        if self._agentview is not None:  # already rendered for this state's observation
            return self._agentview.copy()
        return self.render_camera("agentview")

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        super().close()

    # ------------------------------------------------------------------ helpers
    def render_camera(self, camera: str) -> np.ndarray:
        """An upright RGB image from ``"agentview"`` or ``"wrist"``; makes the renderer on first use."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.sim.model, *self.image_hw, max_geom=200)
            flags = self._renderer.scene.flags
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
                flags[flag] = 0
            flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = 0
        self._renderer.update_scene(self.sim.data, camera=camera)
        return self._renderer.render()

    def _validate_action(self, action: Any) -> np.ndarray:
        try:
            arr = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"action: expected {ACTION_DIM} numbers {_ACTION_LAYOUT}, got {action!r}") from exc
        if arr.shape != (ACTION_DIM,):
            raise ValueError(f"action: expected shape ({ACTION_DIM},) {_ACTION_LAYOUT}, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"action: expected finite values, got {arr.tolist()}")
        return np.clip(arr, -1.0, 1.0)

    def _observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The observation and info of the current simulation state."""
        objects = np.clip(object_state(self._task, self.sim), -OBJECT_STATE_HIGH, OBJECT_STATE_HIGH)
        obs: dict[str, Any] = {}
        self._agentview = None
        if self.obs_mode in ("rgb", "all"):
            obs["image"] = self._agentview = self.render_camera("agentview")
            obs["wrist_image"] = self.render_camera("wrist")
        obs["state"] = np.clip(self.sim.state(), -STATE_HIGH, STATE_HIGH)
        if self.obs_mode in ("state", "all"):
            obs["object_state"] = objects.copy()
        obs["prompt"] = self.prompt
        success = is_success(self._task, self.sim)
        info = {
            "task": self._task,
            "is_success": success,
            "dense_reward": dense_reward(self._task, self.sim, success),
            "object_state": objects,
        }
        return obs, info
