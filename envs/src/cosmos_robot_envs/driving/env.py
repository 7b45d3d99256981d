"""``DrivingEnv``: highway-env behind AlpaSim's boundary (plans in, rig-frame scene out, AlpaGym metrics).

Why highway-env: a real, pip-installable driving simulator (MIT, Gymnasium >= 1.0, no downloads,
seeded episodes deterministic) with IDM/MOBIL traffic on multi-lane roads, fast enough on a CPU for
closed-loop RL. What this wrapper adds is the contract of NVIDIA's AlpaSim / AlpaGym:

- **actions are planned trajectories**: K rig-frame waypoints (AlpaSim's ego frame: x forward, y
  left; ``geometry``), point k where the ego should be
  (k + 1) * 0.1 s from now, followed by a tracker (``geometry.track_plan``) at 10 Hz. The action space
  is the plan flattened, ``(2K,)`` = ``x0, y0, x1, y1, ...`` (the vector layer and the evaluator step
  1-D actions; a policy's chunk row is one plan); ``step`` also takes the ``(K, 2)`` array;
- **observations are the scene in the rig frame**: ``ego_history`` and ``route`` exactly as AlpaSim's
  driver hands them to a policy (``observation/ego_history`` (16, 3) past x, y, yaw at 0.1 s, oldest
  first; ``observation/route`` (N, 3) waypoints), the nearest agents (privileged: AlpaSim shows other
  vehicles only through cameras), a flat ``state`` vector of all of them and the speed for state
  policies, and optionally a top-down camera image (what AlpaSim's ``camera_top_down`` carries);
- **AlpaGym's metrics** in ``info`` every tick: progress along the route, collision, off-road, the
  distance to the ground truth, which is the scripted expert's replay of the same seed
  (``expert.expert_plan``: IDM car following and lane keeping), and per-tick rewards of a preset
  (``progress_safety``: progress +1, collision -10, off-road -5, distance to ground truth -0.01 per
  metre on average; ``distance_to_gt``), whose episode sum is the preset's episode reward.

Every episode has a seed (drawn from the env's generator when ``reset`` gets none), reported in
``info["seed"]``; the same seed and the same plans give the same episode bit for bit.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from cosmos_robot_envs.driving.expert import IDMParams, expert_plan
from cosmos_robot_envs.driving.geometry import (
    TrackerGains,
    route_points,
    to_ego,
    track_plan,
    vectors_to_ego,
    yaw_to_ego,
)
from cosmos_robot_envs.driving.scenarios import SCENARIOS, make_scenario

__all__ = [
    "AGENT_FIELDS",
    "DT",
    "HISTORY_FIELDS",
    "OBS_MODES",
    "REWARD_PRESETS",
    "DrivingEnv",
    "reward_terms",
    "state_layout",
]

DT = 0.1  # seconds per tick: AlpaSim's planning interval and the control rate
OBS_MODES = ("state", "camera")
REWARD_PRESETS = ("progress_safety", "distance_to_gt")
PRESET_TERMS = {  # the named terms of each preset (``reward_terms``), which a trainer may weight
    "progress_safety": ("progress", "collision", "offroad", "dist_to_gt"),
    "distance_to_gt": ("dist_to_gt",),
}
AGENT_FIELDS = ("present", "x", "y", "vx", "vy", "heading")
HISTORY_FIELDS = ("x", "y", "yaw")  # AlpaSim's ego_history columns
_REPLAY_CACHE = 128


def state_layout(history: int, route_len: int, agents: int) -> dict[str, tuple[slice, tuple[int, ...]]]:
    """Where ``ego_history``, the ego's ``speed``, the ``route`` (x, y) and ``agents`` sit in the flat
    ``state`` vector, and their shapes."""
    shapes = {
        "ego_history": (history, len(HISTORY_FIELDS)),
        "speed": (1,),
        "route": (route_len, 2),
        "agents": (agents, len(AGENT_FIELDS)),
    }
    out: dict[str, tuple[slice, tuple[int, ...]]] = {}
    start = 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = (slice(start, start + size), shape)
        start += size
    return out


def reward_terms(preset: str, info: Mapping[str, Any]) -> dict[str, float]:
    """One tick's reward terms of an AlpaGym preset, from the tick's ``info`` (``progress_step``,
    ``collision``, ``offroad``, ``dist_to_gt``, ``max_steps``); their sum is the tick's reward.

    ``progress_safety``: progress +1 per reference route length (the expert replay's), collision -10,
    off-road -5, distance to the ground truth -0.01 per metre averaged over the horizon;
    ``distance_to_gt``: minus the metres to the ground truth averaged over the horizon. One function
    for the env's own reward and the trainers' reward providers (``cosmos_robot_trainers.rl.rewards``).
    """
    dist = float(info["dist_to_gt"]) / int(info["max_steps"])
    if preset == "progress_safety":
        return {
            "progress": float(info["progress_step"]),
            "collision": -10.0 * bool(info["collision"]),
            "offroad": -5.0 * bool(info["offroad"]),
            "dist_to_gt": -0.01 * dist,
        }
    if preset == "distance_to_gt":
        return {"dist_to_gt": -dist}
    raise ValueError(f"reward preset {preset!r}; choose from {list(REWARD_PRESETS)}")


class DrivingEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    metadata = {"render_modes": ["rgb_array"], "render_fps": int(1 / DT)}

    def __init__(
        self,
        tasks: Sequence[str] | None = None,
        obs_mode: str = "state",
        image_size: int = 64,
        max_steps: int = 200,
        plan_len: int = 20,
        history: int = 16,
        route_len: int = 20,
        route_spacing_m: float = 5.0,
        agents: int = 8,
        agent_range_m: float = 100.0,
        reward: str = "progress_safety",
        expert_replay: bool = True,
        render_mode: str | None = None,
    ) -> None:
        names = tuple(tasks) if tasks else tuple(SCENARIOS)
        unknown = [t for t in names if t not in SCENARIOS]
        if unknown:
            raise ValueError(f"tasks: {unknown} not driving scenarios; choose from {list(SCENARIOS)}")
        if obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode: {obs_mode!r}; choose from {list(OBS_MODES)}")
        if reward not in REWARD_PRESETS:
            raise ValueError(f"reward: {reward!r}; choose from {list(REWARD_PRESETS)}")
        for name, value in (("max_steps", max_steps), ("plan_len", plan_len), ("history", history)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: {render_mode!r}; only 'rgb_array' is supported")
        self.tasks, self.obs_mode, self.image_size = names, obs_mode, int(image_size)
        self.max_steps, self.plan_len, self.history = int(max_steps), int(plan_len), int(history)
        self.route_len, self.route_spacing_m = int(route_len), float(route_spacing_m)
        self.n_agents, self.agent_range_m = int(agents), float(agent_range_m)
        self.reward_preset, self.expert_replay, self.render_mode = reward, bool(expert_replay), render_mode
        self.gains, self.idm = TrackerGains(), IDMParams()
        layout = state_layout(self.history, self.route_len, self.n_agents)
        state_dim = max(sl.stop for sl, _ in layout.values())
        obs: dict[str, spaces.Space[Any]] = {
            "ego_history": spaces.Box(-np.inf, np.inf, (self.history, len(HISTORY_FIELDS)), np.float32),
            "route": spaces.Box(-np.inf, np.inf, (self.route_len, 3), np.float32),
            "agents": spaces.Box(-np.inf, np.inf, (self.n_agents, len(AGENT_FIELDS)), np.float32),
            "state": spaces.Box(-np.inf, np.inf, (state_dim,), np.float32),
        }
        if obs_mode == "camera":
            obs["image"] = spaces.Box(0, 255, (self.image_size, 4 * self.image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(obs)  # type: ignore[assignment]
        # a plan reaches ~60 m in 2 s at highway speed; the box bounds what the tracker accepts
        low = np.tile(np.array([-50.0, -50.0], np.float32), self.plan_len)
        high = np.tile(np.array([200.0, 50.0], np.float32), self.plan_len)
        self.action_space = spaces.Box(low, high, dtype=np.float32)
        self._sims: dict[str, Any] = {}
        # (task, seed) -> the expert's positions and whether its episode ended in a crash or off the road
        self._replays: OrderedDict[tuple[str, int], tuple[np.ndarray, bool]] = OrderedDict()
        self.task = names[0]
        self.seed_used = 0
        self._tick = 0
        self._history: deque[np.ndarray] = deque(maxlen=self.history)
        self._progress_m = 0.0
        self._reference_m = 1.0
        self._truth: np.ndarray | None = None
        self._dist_sum = 0.0
        self._dist_ticks = 0
        self._route_complete = False
        self._done = True

    # -- simulators -------------------------------------------------------------------------
    def _sim(self, task: str) -> Any:
        if task not in self._sims:
            self._sims[task] = make_scenario(task, duration_s=self.max_steps * DT)
        return self._sims[task]

    @property
    def ego(self) -> Any:
        return self._sim(self.task).unwrapped.vehicle

    @property
    def road(self) -> Any:
        return self._sim(self.task).unwrapped.road

    def expert_action(self) -> np.ndarray:
        """The scripted expert's plan for the current tick, flattened as an action (demonstrations)."""
        return expert_plan(self.road, self.ego, self.plan_len, DT, self.idm).reshape(-1)

    def _replay(self, task: str, seed: int) -> tuple[np.ndarray, bool]:
        """World positions of the ego, tick by tick, when the expert drives episode ``seed`` of ``task``,
        and whether that episode ended in a crash or off the road (not at the horizon or the road's end)."""
        key = (task, seed)
        if key in self._replays:
            self._replays.move_to_end(key)
            return self._replays[key]
        sim = make_scenario(task, duration_s=self.max_steps * DT)
        sim.reset(seed=seed)
        env = sim.unwrapped
        positions, failed = [], False
        for _ in range(self.max_steps):
            plan = expert_plan(env.road, env.vehicle, self.plan_len, DT, self.idm)
            _, _, terminated, truncated, _ = sim.step(
                track_plan(plan, float(env.vehicle.speed), DT, env.vehicle.LENGTH, self.gains)
            )
            positions.append(np.array(env.vehicle.position, np.float64))
            failed = bool(env.vehicle.crashed or not env.vehicle.on_road)
            if failed or terminated or truncated:
                break
        sim.close()
        self._replays[key] = (np.stack(positions), failed)
        while len(self._replays) > _REPLAY_CACHE:
            self._replays.popitem(last=False)
        return self._replays[key]

    def _reference_distance(self, replay: np.ndarray, failed: bool) -> float:
        """The distance ``progress`` divides by: the expert's path over its episode; when the expert
        crashed or left the road, that path extrapolated to the horizon at its mean speed (a crash at
        2.5 s would otherwise make 2.5 s of driving the whole route, and progress of 3-4 for a planner
        that drives on safely)."""
        if len(replay) < 2:
            return self.idm.target_speed * self.max_steps * DT
        path = self._path_length(replay)
        if failed and len(replay) < self.max_steps:
            path *= self.max_steps / len(replay)
        return max(1.0, path)

    # -- gymnasium --------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        task = options.get("task")
        if task is None:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if task not in SCENARIOS:
            raise ValueError(f"reset options: task {task!r} is not a driving scenario; choose from {list(SCENARIOS)}")
        episode_seed = options.get("seed", seed)
        if episode_seed is None:
            episode_seed = int(self.np_random.integers(2**31 - 1))
        self.task, self.seed_used = str(task), int(episode_seed)
        self._sim(self.task).reset(seed=self.seed_used)
        self._tick, self._progress_m, self._dist_sum, self._done = 0, 0.0, 0.0, False
        self._dist_ticks, self._route_complete = 0, False
        self._history.clear()
        for _ in range(self.history):
            self._history.append(self._ego_state())
        if self.expert_replay:
            self._truth, expert_failed = self._replay(self.task, self.seed_used)
            self._reference_m = self._reference_distance(self._truth, expert_failed)
        else:
            self._truth = None
            self._reference_m = self.idm.target_speed * self.max_steps * DT
        return self._observe(), self._info(collision=False, offroad=False, dist=0.0, reward_terms={})

    def _path_length(self, positions: np.ndarray) -> float:
        start = np.asarray(self.ego.position, np.float64)
        pts = np.concatenate([start[None], positions])
        return float(np.linalg.norm(np.diff(pts, axis=0), axis=1).sum())

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("DrivingEnv.step after the episode ended; call reset()")
        plan = self._check_plan(action)
        ego = self.ego
        before = np.array(ego.position, np.float64)
        lane = self.road.network.get_lane(ego.lane_index)
        s_before, _ = lane.local_coordinates(before)
        direction = lane.heading_at(s_before)
        control = track_plan(plan, float(ego.speed), DT, ego.LENGTH, self.gains)
        _, _, sim_terminated, sim_truncated, _ = self._sim(self.task).step(control)
        ego = self.ego
        self._tick += 1
        moved = np.array(ego.position, np.float64) - before
        step_m = float(moved[0] * math.cos(direction) + moved[1] * math.sin(direction))
        self._progress_m += step_m
        collision, offroad = bool(ego.crashed), not bool(ego.on_road)
        dist = 0.0
        if self._truth is not None and self._tick <= len(self._truth):  # none once the expert's replay ended
            dist = float(np.linalg.norm(np.asarray(ego.position, np.float64) - self._truth[self._tick - 1]))
            self._dist_sum += dist
            self._dist_ticks += 1
        self._history.append(self._ego_state())
        terms = self._reward_terms(step_m, collision, offroad, dist)
        terminated = collision or offroad
        # highway-env ending the scenario itself (merge: past the end of the road) completes the route
        self._route_complete = not terminated and bool(sim_terminated or sim_truncated)
        truncated = not terminated and (self._tick >= self.max_steps or self._route_complete)
        self._done = terminated or truncated
        info = self._info(collision=collision, offroad=offroad, dist=dist, reward_terms=terms)
        info["progress_step"] = step_m / self._reference_m
        if self._done:  # AlpaGym's episode numbers, carried into eval's records and summaries
            info["episode_metrics"] = {
                "progress": info["progress"],
                "collision": collision,
                "offroad": offroad,
                "mean_dist_to_gt": info["mean_dist_to_gt"],
            }
        return self._observe(), float(sum(terms.values())), terminated, truncated, info

    def _check_plan(self, action: Any) -> np.ndarray:
        plan = np.asarray(action)
        if plan.shape == (2 * self.plan_len,):
            plan = plan.reshape(self.plan_len, 2)
        if plan.shape != (self.plan_len, 2):
            raise ValueError(
                f"action: a plan of shape ({2 * self.plan_len},) or ({self.plan_len}, 2) (rig-frame x forward, "
                f"y left, every {DT} s), got shape {plan.shape}"
            )
        if not np.issubdtype(plan.dtype, np.floating) and not np.issubdtype(plan.dtype, np.integer):
            raise ValueError(f"action: expected a numeric plan, got dtype {plan.dtype}")
        if not np.isfinite(plan).all():
            raise ValueError("action: the plan holds NaN or inf")
        return plan.astype(np.float64)

    def _reward_terms(self, step_m: float, collision: bool, offroad: bool, dist: float) -> dict[str, float]:
        tick = {"progress_step": step_m / self._reference_m, "collision": collision, "offroad": offroad}
        return reward_terms(self.reward_preset, {**tick, "dist_to_gt": dist, "max_steps": self.max_steps})

    # -- observations ------------------------------------------------------------------------
    def _ego_state(self) -> np.ndarray:
        ego = self.ego
        return np.array([ego.position[0], ego.position[1], ego.heading, ego.speed], np.float64)

    def _observe(self) -> dict[str, np.ndarray]:
        ego, road = self.ego, self.road
        origin, heading = np.asarray(ego.position, np.float64), float(ego.heading)
        past = np.stack(self._history)
        history = np.zeros((self.history, len(HISTORY_FIELDS)), np.float32)
        history[:, :2] = to_ego(past[:, :2], origin, heading)
        history[:, 2] = yaw_to_ego(past[:, 2], heading)
        route = np.zeros((self.route_len, 3), np.float32)  # z = 0: a flat road
        route[:, :2] = to_ego(
            route_points(road, ego.lane_index, origin, self.route_len, self.route_spacing_m), origin, heading
        )
        agents = np.zeros((self.n_agents, len(AGENT_FIELDS)), np.float32)
        others = [v for v in road.vehicles if v is not ego]
        dists = [float(np.linalg.norm(np.asarray(v.position) - origin)) for v in others]
        near = [others[i] for i in np.argsort(dists, kind="stable") if dists[i] <= self.agent_range_m][: self.n_agents]
        for row, v in enumerate(near):
            agents[row, 0] = 1.0
            agents[row, 1:3] = to_ego(np.asarray(v.position), origin, heading)
            agents[row, 3:5] = vectors_to_ego(np.asarray(v.velocity), heading)
            agents[row, 5] = yaw_to_ego(float(v.heading), heading)
        speed = np.array([ego.speed], np.float32)
        obs = {
            "ego_history": history,
            "route": route,
            "agents": agents,
            "state": np.concatenate([history.ravel(), speed, route[:, :2].ravel(), agents.ravel()]).astype(np.float32),
        }
        if self.obs_mode == "camera":
            obs["image"] = self._camera()
        return obs

    def _camera(self) -> np.ndarray:
        frame = np.asarray(self._sim(self.task).render())
        h, w = self.image_size, 4 * self.image_size
        rows = (np.arange(h) * frame.shape[0] // h).clip(0, frame.shape[0] - 1)
        cols = (np.arange(w) * frame.shape[1] // w).clip(0, frame.shape[1] - 1)
        return np.ascontiguousarray(frame[rows][:, cols, :3]).astype(np.uint8)

    def _info(self, *, collision: bool, offroad: bool, dist: float, reward_terms: dict[str, float]) -> dict[str, Any]:
        return {
            "task": self.task,
            "seed": self.seed_used,
            "tick": self._tick,
            "max_steps": self.max_steps,
            "speed": float(self.ego.speed),
            "progress_m": self._progress_m,
            "progress": self._progress_m / self._reference_m,
            "collision": collision,
            "offroad": offroad,
            "dist_to_gt": dist,
            "mean_dist_to_gt": self._dist_sum / max(1, self._dist_ticks),
            "route_complete": self._route_complete,
            "reward_terms": reward_terms,
            "is_success": bool(
                (self._tick >= self.max_steps or self._route_complete) and not collision and not offroad
            ),
        }

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return np.asarray(self._sim(self.task).render())

    def close(self) -> None:
        for sim in self._sims.values():
            sim.close()
        self._sims.clear()
