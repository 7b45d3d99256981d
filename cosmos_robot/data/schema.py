"""The feature layouts of demonstration datasets, shared by the recorder and the loader.

Why one module: the recorder writes these LeRobot feature names and the loader (and the flow policy's
wire mapping) reads them back; a renamed key must break at one place, not silently at three.

Layout (LeRobot v3 conventions; LeRobot adds ``timestamp``, ``frame_index``, ``episode_index``,
``index`` and ``task_index`` itself, and the instruction is the per-frame ``task`` string):

================================ ======= ============ ==================================================
feature                          dtype   shape        meaning
================================ ======= ============ ==================================================
``observation.images.image``     image   (S, S, 3)    agent-view camera, uint8 RGB (``video`` with --videos)
``observation.images.wrist_image`` image (S, S, 3)    wrist camera
``observation.state``            float32 (8,)         end-effector position (3), axis-angle (3), fingers (2)
``observation.object_state``     float32 (15,)        PRIVILEGED simulator state (object pose, goal, drawer
                                                      opening, task one-hot): kept for RL critics and
                                                      analysis; a deployable policy must not read it
``action``                       float32 (7,)         the expert's command at this frame: position delta (3),
                                                      rotation delta (3), gripper (1), all in [-1, 1]
================================ ======= ============ ==================================================

Frame ``t`` pairs the observation *before* step ``t`` with the action taken at ``t``; the observation
after the last action is not stored (LeRobot's convention).

The driving suite's layout (``DRIVING``; ``cosmos_robot_envs.driving``) at 10 fps:

================================ ======= ============ ==================================================
``observation.state``            float32 (137,)       the rig-frame scene: ego history (16 x 3), speed (1),
                                                      route (20 x 2), nearest agents (8 x 6) (``DrivingEnv``'s
                                                      flat state; the agents are privileged for AlpaSim)
``observation.ego_history``      float32 (48,)        AlpaSim's ``observation/ego_history`` (16, 3), flattened
``observation.route``            float32 (60,)        AlpaSim's ``observation/route`` (20, 3), flattened
``observation.images.image``     image   (S, 4S, 3)   top-down camera (only when cameras are recorded)
``action``                       float32 (40,)        the expert's plan: 20 rig-frame waypoints (x, y) at 0.1 s
================================ ======= ============ ==================================================

``DemoLayout`` bundles what differs per suite (features, rate, robot type, the expert that acts on an
observation row, the env the recorder steps); ``demo_layout(suite)`` looks one up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_FIELDS, STATE_FIELDS

FPS = 20  # the tabletop control rate
ROBOT_TYPE = "cosmos_robot_tabletop_gripper"
CAMERAS = ("image", "wrist_image")  # env observation keys of the two cameras
STATE = "observation.state"
OBJECT_STATE = "observation.object_state"
ACTION = "action"
ACTION_NAMES = ("dx", "dy", "dz", "drx", "dry", "drz", "gripper")
SIDECAR = "meta/cosmos_robot.json"  # our per-dataset record: seeds, command, failures (see record.py)


def camera_key(camera: str) -> str:
    """``"image"`` -> ``"observation.images.image"`` (LeRobot's camera feature name)."""
    return f"observation.images.{camera}"


def _object_state_names() -> list[str]:
    names: list[str] = []
    for name, start, stop in OBJECT_STATE_FIELDS:
        if stop - start == 1:
            names.append(name)
        else:
            names.extend(f"{name}_{i}" for i in range(stop - start))
    return names


def demo_features(image_size: int, use_videos: bool = False) -> dict[str, dict[str, Any]]:
    """The ``features`` argument of ``LeRobotDataset.create`` for tabletop demonstrations."""
    visual = "video" if use_videos else "image"
    features: dict[str, dict[str, Any]] = {
        camera_key(cam): {
            "dtype": visual,
            "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
        for cam in CAMERAS
    }
    features[STATE] = {"dtype": "float32", "shape": (len(STATE_FIELDS),), "names": list(STATE_FIELDS)}
    object_names = _object_state_names()
    features[OBJECT_STATE] = {"dtype": "float32", "shape": (len(object_names),), "names": object_names}
    features[ACTION] = {"dtype": "float32", "shape": (len(ACTION_NAMES),), "names": list(ACTION_NAMES)}
    return features


class DemoExpert(Protocol):
    """A scripted expert as the recorder drives it: ``reset()`` per episode, ``act(row) -> action``
    where ``row`` is one env's observation (the suite's vector keys and cameras)."""

    def reset(self) -> None: ...

    def act(self, row: Mapping[str, Any]) -> np.ndarray: ...


# (label action, noise scale, episode generator) -> the action executed instead: DART-style recording
# (Laskey et al. 2017) perturbs what runs but stores the expert's clean label, so the data shows the
# expert recovering from the deviations a learned policy (and RL's sampling noise) will cause
Perturb = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class DemoLayout:
    """What a suite's demonstration dataset holds and how the recorder produces it."""

    suite: str
    fps: int  # control rate (LeRobot's ``fps``)
    robot_type: str  # LeRobot's ``robot_type``
    cameras: tuple[str, ...]  # env observation keys stored as images (when cameras are recorded)
    vectors: tuple[str, ...]  # env observation keys stored as ``observation.<key>`` float32 vectors
    features: Callable[[int, bool, bool], dict[str, dict[str, Any]]]  # (image_size, use_videos, cameras)
    expert: Callable[[str], DemoExpert]  # task -> its expert
    # (tasks, image_size, max_steps, cameras) -> env factory of the recording envs
    make_env: Callable[[tuple[str, ...], int, int | None, bool], Any]
    privileged: dict[str, str] = field(default_factory=dict)  # feature -> why a deployable policy must not read it
    # how ``record --expert-noise`` perturbs the executed action; None: the suite has no perturbation
    perturb_factory: Callable[[], Perturb] | None = None


class _TabletopExpert:
    def __init__(self, task: str) -> None:
        from cosmos_robot_envs.tabletop.experts import scripted_expert

        self.expert = scripted_expert(task)

    def reset(self) -> None:
        self.expert.reset()

    def act(self, row: Mapping[str, Any]) -> np.ndarray:
        return np.asarray(self.expert.act({"state": row["state"], "object_state": row["object_state"]}))


def _tabletop_features(image_size: int, use_videos: bool, cameras: bool) -> dict[str, dict[str, Any]]:
    features = demo_features(image_size, use_videos)
    if not cameras:
        for cam in CAMERAS:
            del features[camera_key(cam)]
    return features


def _tabletop_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None, cameras: bool) -> Any:
    from cosmos_robot_envs.eval import get_suite

    return get_suite("tabletop").make_env(tasks, image_size, max_steps, cameras)


DRIVING_PLAN_LEN = 20  # waypoints per plan (DrivingEnv's default)
DRIVING_HISTORY, DRIVING_ROUTE_LEN, DRIVING_AGENTS = 16, 20, 8  # DrivingEnv's defaults


class _DrivingExpert:
    """IDM + lane keeping from ``state`` alone (``plan_from_state``): what a learned planner can see."""

    def __init__(self, task: str) -> None:
        self.task = task

    def reset(self) -> None:
        pass

    def act(self, row: Mapping[str, Any]) -> np.ndarray:
        from cosmos_robot_envs.driving.expert_policy import plan_from_state

        return plan_from_state(np.asarray(row["state"])).reshape(-1)


class _PlanPerturbation:
    """Executed plan = the expert's plan shifted sideways by an AR(1) lateral offset and stretched by an
    AR(1) speed factor (stationary std ``0.35 * noise`` m and ``0.05 * noise``; correlation 0.9 per tick),
    so an episode drifts off the lane centre and off the expert's speed for seconds at a time."""

    def __init__(self) -> None:
        self.offset, self.stretch = 0.0, 0.0

    def __call__(self, plan: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
        keep = 0.9
        scale = np.sqrt(1 - keep**2)
        self.offset = keep * self.offset + scale * 0.35 * noise * rng.standard_normal()
        self.stretch = keep * self.stretch + scale * 0.05 * noise * rng.standard_normal()
        out = np.asarray(plan, np.float32).reshape(-1, 2).copy()
        out[:, 0] *= 1.0 + self.stretch
        out[:, 1] += self.offset
        return out.reshape(-1)


class _HandPerturbation:
    """Executed action = the expert's with an AR(1) offset on the hand's translation command (dims 0-2,
    stationary std ``0.3 * noise`` of the action range per axis, correlation 0.8 per step), so the hand
    wanders a few centimetres off the expert's path for several steps at a time and the expert, whose
    next label is read from where the hand really is, shows the way back (approach, grasp, carry and
    release alike). Rotation and gripper commands run as the expert gave them."""

    def __init__(self) -> None:
        self.offset = np.zeros(3)

    def __call__(self, action: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
        keep = 0.8
        self.offset = keep * self.offset + np.sqrt(1 - keep**2) * 0.3 * noise * rng.standard_normal(3)
        out = np.asarray(action, np.float32).copy()
        out[:3] = np.clip(out[:3] + self.offset, -1.0, 1.0)
        return out


def _driving_features(image_size: int, use_videos: bool, cameras: bool) -> dict[str, dict[str, Any]]:
    from cosmos_robot_envs.driving.env import AGENT_FIELDS, HISTORY_FIELDS, state_layout

    names: list[str] = []
    for part, (_, shape) in state_layout(DRIVING_HISTORY, DRIVING_ROUTE_LEN, DRIVING_AGENTS).items():
        cols = {"ego_history": HISTORY_FIELDS, "speed": ("v",), "route": ("x", "y"), "agents": AGENT_FIELDS}[part]
        names.extend(f"{part}_{i}_{c}" for i in range(shape[0]) for c in cols)
    plan = [f"{axis}{k}" for k in range(DRIVING_PLAN_LEN) for axis in ("x", "y")]
    history = [f"{c}{i}" for i in range(DRIVING_HISTORY) for c in HISTORY_FIELDS]
    route = [f"{c}{i}" for i in range(DRIVING_ROUTE_LEN) for c in ("x", "y", "z")]
    features: dict[str, dict[str, Any]] = {
        STATE: {"dtype": "float32", "shape": (len(names),), "names": names},
        "observation.ego_history": {"dtype": "float32", "shape": (len(history),), "names": history},
        "observation.route": {"dtype": "float32", "shape": (len(route),), "names": route},
        ACTION: {"dtype": "float32", "shape": (len(plan),), "names": plan},
    }
    if cameras:
        features[camera_key("image")] = {
            "dtype": "video" if use_videos else "image",
            "shape": (image_size, 4 * image_size, 3),
            "names": ["height", "width", "channels"],
        }
    return features


def _driving_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None, cameras: bool) -> Any:
    from cosmos_robot_envs.eval import get_suite
    from cosmos_robot_envs.vector import EnvFactory

    factory = get_suite("driving").make_env(tasks, image_size, max_steps, cameras)
    if not isinstance(factory, EnvFactory):
        raise TypeError(f"the driving suite's make_env returned {type(factory).__name__}, expected an EnvFactory")
    # no ground-truth replay: demonstrations need no distance to it, and it halves the stepping rate
    return dataclasses.replace(factory, kwargs={**factory.kwargs, "expert_replay": False})


TABLETOP = DemoLayout(
    suite="tabletop",
    fps=FPS,
    robot_type=ROBOT_TYPE,
    cameras=CAMERAS,
    vectors=("state", "object_state"),
    features=_tabletop_features,
    expert=_TabletopExpert,
    make_env=_tabletop_env,
    privileged={
        OBJECT_STATE: "simulator state (object pose, goal, drawer opening, task one-hot) the experts act "
        "from; for RL critics and analysis, not a deployable policy input"
    },
    perturb_factory=_HandPerturbation,
)
DRIVING = DemoLayout(
    suite="driving",
    fps=10,
    robot_type="cosmos_robot_driving_ego",
    cameras=("image",),
    vectors=("state", "ego_history", "route"),  # the last two flattened (AlpaSim's arrays, row-major)
    features=_driving_features,
    expert=_DrivingExpert,
    make_env=_driving_env,
    perturb_factory=_PlanPerturbation,
)
DEMO_LAYOUTS: dict[str, DemoLayout] = {"tabletop": TABLETOP, "driving": DRIVING}


def demo_layout(suite: str) -> DemoLayout:
    """The demonstration layout of ``suite``; a ``ValueError`` naming the suites that have experts otherwise."""
    if suite in DEMO_LAYOUTS:
        return DEMO_LAYOUTS[suite]
    hint = (
        "; LIBERO's demonstrations are published as LeRobot datasets (e.g. the lerobot/libero_* ones)"
        if suite.startswith("libero")
        else ""
    )
    raise ValueError(
        f"suite {suite!r}: `record` rolls out scripted experts, which exist for {sorted(DEMO_LAYOUTS)} only{hint}"
    )
