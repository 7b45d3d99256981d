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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cosmos_robot_envs.eval.config import EpisodeSpec
from cosmos_robot_envs.eval.wire import LIBERO_KEYS, TABLETOP_KEYS
from cosmos_robot_envs.vector import EnvFactory
from cosmos_robot_envs.vector.runner import EnvFn

__all__ = ["SUITE_NAMES", "Suite", "get_suite"]


@dataclass(frozen=True)
class Suite:
    name: str
    task_names: tuple[str, ...]
    make_env: Callable[[tuple[str, ...], int, int | None], EnvFn]  # (tasks, image_size, max_steps) -> factory
    wire_keys: dict[str, str]  # env observation key -> openpi wire key
    fps: int  # control rate, for videos
    video_key: str  # env observation key of the agent-view camera
    reset_options: Callable[[EpisodeSpec], dict[str, Any]] = field(default=lambda spec: {"task": spec.task})

    def resolve_tasks(self, tasks: tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
        """``tasks`` checked against the suite (empty or None: all of them, in suite order)."""
        if not tasks:
            return self.task_names
        unknown = [t for t in tasks if t not in self.task_names]
        if unknown:
            raise ValueError(
                f"tasks: {', '.join(repr(t) for t in unknown)} not in suite {self.name!r}; "
                f"its tasks: {', '.join(self.task_names)}"
            )
        return tuple(dict.fromkeys(tasks))


def _tabletop_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None) -> EnvFn:
    # obs_mode="all": cameras for learned policies plus object_state for the scripted experts; the
    # wire mapping drops object_state for policies whose input spec does not declare it.
    kwargs = {"tasks": list(tasks), "obs_mode": "all", "image_size": image_size, "max_steps": max_steps}
    return EnvFactory("CosmosRobot/Tabletop-v0", kwargs)


def _tabletop() -> Suite:
    from cosmos_robot_envs.tabletop.tasks import TASK_NAMES  # pure data, no MuJoCo import

    return Suite("tabletop", TASK_NAMES, _tabletop_env, TABLETOP_KEYS, fps=20, video_key="image")


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

    def make_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None) -> EnvFn:
        kwargs = {"suite": name, "tasks": list(tasks), "image_size": image_size, "max_steps": max_steps}
        return EnvFactory(ENV_ID, kwargs, python=python)

    names = tuple(t["name"] for t in entry["tasks"])
    return Suite(name, names, make_env, LIBERO_KEYS, fps=20, video_key="image", reset_options=_libero_options)


_LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
_SUITES: dict[str, Callable[[], Suite]] = {
    "tabletop": _tabletop,
    **{name: functools.partial(_libero, name) for name in _LIBERO_SUITES},
}
SUITE_NAMES = tuple(_SUITES)


def get_suite(name: str) -> Suite:
    if name not in _SUITES:
        raise ValueError(f"suite: unknown suite {name!r}; known suites: {', '.join(SUITE_NAMES)}")
    return _SUITES[name]()
