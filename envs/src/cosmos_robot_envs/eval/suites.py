"""Evaluation suites: how to build a suite's envs and how its observations map to the wire.

Why a registry of small records instead of suite-specific runners: the evaluator's loop (schedule,
lockstep stepping, batched queries, records, report) is the same for every simulator. A suite only
says which tasks it has, how to make one env that can run any of them (picked per episode with
``reset(options=suite.reset_options(episode))``, at least ``{"task": name}``), the control rate (for
videos) and the key map to the openpi wire convention.

LIBERO's suites (``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``,
``libero_90``) run their envs under LIBERO's own interpreter (``.venv-libero``); episode ``i`` of a
task starts from the task's fixed benchmark initial state ``i mod 50``, as in openpi's and
LeRobot's evaluations.

``driving`` (issue 20) runs highway-env scenarios behind AlpaSim's boundary (``cosmos_robot_envs.driving``):
an action is one flattened plan, so a planner answering one plan per request is evaluated with
``--replan-steps 1``; success is finishing the horizon (or the scenario's road) without a collision or
leaving the road.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosmos_robot_envs.eval.config import EpisodeSpec
from cosmos_robot_envs.eval.wire import DRIVING_KEYS, LIBERO_KEYS, TABLETOP_KEYS
from cosmos_robot_envs.vector import EnvFactory
from cosmos_robot_envs.vector.runner import EnvFn

__all__ = ["SUITE_NAMES", "Suite", "get_suite"]


@dataclass(frozen=True)
class Suite:
    name: str
    task_names: tuple[str, ...]
    # (tasks, image_size, max_steps, cameras) -> factory; cameras=False: the policy reads no image
    # (a camera-free policy), so a suite that can skip rendering does (tabletop: 7.7x faster stepping)
    make_env: Callable[[tuple[str, ...], int, int | None, bool], EnvFn]
    wire_keys: dict[str, str]  # env observation key -> openpi wire key
    fps: int  # control rate, for videos
    video_key: str  # env observation key of the agent-view camera
    image_keys: tuple[str, ...] = ("image", "wrist_image")  # env observation keys of the cameras
    reset_options: Callable[[EpisodeSpec], dict[str, Any]] = field(default=lambda spec: {"task": spec.task})

    def resolve_tasks(self, tasks: str | Sequence[str | int] | None) -> tuple[str, ...]:
        """``tasks`` checked against the suite, as names in the order given (empty or None: all of them).

        Each item is a task name, an index into ``task_names`` (``3``) or an inclusive index range
        (``"0-4"``); a string is split on commas (``"0,3"``). Indices exist because LIBERO's task
        names are 80-character sentences. An exact name always wins over an index reading.
        """
        items = tasks.split(",") if isinstance(tasks, str) else list(tasks or ())
        words = [str(t).strip() for t in items if str(t).strip()]
        if not words:
            return self.task_names
        resolved: list[str] = []
        unknown: list[str] = []
        for word in words:
            picked = [word] if word in self.task_names else self._by_index(word)
            if picked is None:
                unknown.append(word)
            else:
                resolved.extend(picked)
        if unknown:
            n = len(self.task_names)
            listed = ", ".join(f"[{i}] {name}" for i, name in enumerate(self.task_names))
            raise ValueError(
                f"tasks: {', '.join(repr(t) for t in unknown)} not in suite {self.name!r}; its tasks: {listed} "
                f"(or pick them by index 0-{n - 1}, e.g. '0,3' or '0-{min(n - 1, 4)}')"
            )
        return tuple(dict.fromkeys(resolved))

    def _by_index(self, word: str) -> list[str] | None:
        """The tasks ``word`` names as an index (``"3"``) or inclusive range (``"0-4"``); None if it is neither."""
        lo, sep, hi = word.partition("-")
        if not (lo.strip().isdigit() and (not sep or hi.strip().isdigit())):
            return None
        first, last = int(lo), int(hi) if sep else int(lo)
        if first > last or last >= len(self.task_names):
            return None
        return list(self.task_names[first : last + 1])


def _tabletop_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None, cameras: bool = True) -> EnvFn:
    # obs_mode="all": cameras for learned policies plus object_state for the scripted experts and
    # camera-free policies; the wire mapping drops object_state for policies whose input spec does
    # not declare it. A policy that reads no camera gets obs_mode="state": nothing is rendered.
    obs_mode = "all" if cameras else "state"
    kwargs = {"tasks": list(tasks), "obs_mode": obs_mode, "image_size": image_size, "max_steps": max_steps}
    return EnvFactory("CosmosRobot/Tabletop-v0", kwargs)


def _tabletop() -> Suite:
    from cosmos_robot_envs.tabletop.tasks import TASK_NAMES  # pure data, no MuJoCo import

    return Suite("tabletop", TASK_NAMES, _tabletop_env, TABLETOP_KEYS, fps=20, video_key="image")


def _driving_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None, cameras: bool = True) -> EnvFn:
    # camera-free planners (the usual case) get obs_mode="state": highway-env renders nothing
    kwargs = {"tasks": list(tasks), "obs_mode": "camera" if cameras else "state", "image_size": image_size}
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    return EnvFactory("cosmos_robot_envs.driving:CosmosRobot/Driving-v0", kwargs)  # the module registers the id


def _driving() -> Suite:
    from cosmos_robot_envs.driving.scenarios import SCENARIOS  # pure data, no highway-env import

    return Suite(
        "driving", tuple(SCENARIOS), _driving_env, DRIVING_KEYS, fps=10, video_key="image", image_keys=("image",)
    )


LIBERO_INIT_STATES = 50  # fixed initial states per LIBERO task


def _libero_options(spec: EpisodeSpec) -> dict[str, Any]:
    return {"task": spec.task, "init_state": spec.index % LIBERO_INIT_STATES}


def _libero(name: str) -> Suite:
    from cosmos_robot_envs.libero import ENV_ID, LiberoNotFound, libero_catalog, libero_python

    try:
        python = libero_python()
        entry = libero_catalog(python)[name]
    except LiberoNotFound as exc:
        raise ValueError(f"suite {name!r}: {exc}") from exc

    def make_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None, cameras: bool = True) -> EnvFn:
        kwargs = {"suite": name, "tasks": list(tasks), "image_size": image_size, "max_steps": max_steps}
        return EnvFactory(ENV_ID, kwargs, python=python)

    names = tuple(t["name"] for t in entry["tasks"])
    return Suite(name, names, make_env, LIBERO_KEYS, fps=20, video_key="image", reset_options=_libero_options)


_LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
_SUITES: dict[str, Callable[[], Suite]] = {
    "tabletop": _tabletop,
    "driving": _driving,
    **{name: functools.partial(_libero, name) for name in _LIBERO_SUITES},
}
SUITE_NAMES = tuple(_SUITES)


def get_suite(name: str) -> Suite:
    if name not in _SUITES:
        raise ValueError(f"suite: unknown suite {name!r}; known suites: {', '.join(SUITE_NAMES)}")
    return _SUITES[name]()
