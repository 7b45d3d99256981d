"""Gymnasium ids for the tabletop suite, ``make_env`` and suite/task-list resolution.

Ids: ``CosmosRobot/Reach-v0``, ``CosmosRobot/Push-v0``, ``CosmosRobot/PickPlace-v0``,
``CosmosRobot/OpenDrawer-v0`` (one task each) and ``CosmosRobot/Tabletop-v0`` (all tasks; pick one per
episode with ``reset(options={"task": name})``). Keyword arguments pass through to ``TabletopEnv``,
e.g. ``gym.make("CosmosRobot/Push-v0", obs_mode="state")`` or ``image_size=64``.

No ``max_episode_steps`` is registered: the env truncates itself at its task's ``max_steps`` (the
multi-task env's ``max_steps`` changes per episode); pass ``max_steps=N`` to change it. Registration only
names an entry point, so it is cheap and idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from cosmos_robot_envs.tabletop.env import TabletopEnv
from cosmos_robot_envs.tabletop.tasks import MULTITASK_ENV_ID, SUITES, TASKS, get_task

__all__ = ["ENTRY_POINT", "make_env", "register_tabletop_envs", "resolve_tasks"]

ENTRY_POINT = "cosmos_robot_envs.tabletop.env:TabletopEnv"


def register_tabletop_envs() -> None:
    """Register every tabletop id with gymnasium (a no-op for ids already registered)."""
    for spec in TASKS.values():
        if spec.env_id not in gym.registry:
            gym.register(id=spec.env_id, entry_point=ENTRY_POINT, kwargs={"task": spec.name})
    if MULTITASK_ENV_ID not in gym.registry:
        gym.register(id=MULTITASK_ENV_ID, entry_point=ENTRY_POINT, kwargs={"task": None})


def make_env(task: str | None, **kwargs: Any) -> TabletopEnv:
    """A ``TabletopEnv`` for ``task`` (``None``: the multi-task env), without gymnasium's wrappers.

    ``kwargs`` are ``TabletopEnv``'s: ``obs_mode``, ``image_size``, ``render_mode``, ``max_steps``,
    ``tasks`` (multi-task only).
    """
    return TabletopEnv(task if task is None else get_task(task).name, **kwargs)


def resolve_tasks(suite: str = "tabletop", tasks: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The task names a CLI asked for: ``tasks`` as ``"reach,push"`` or a list; ``None``: the whole suite."""
    if suite not in SUITES:
        raise ValueError(f"suite: unknown suite {suite!r}; known suites: {', '.join(SUITES)}")
    if tasks is None:
        return SUITES[suite]
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else [str(t).strip() for t in tasks]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"tasks: expected at least one task of suite {suite!r}: {', '.join(SUITES[suite])}")
    for name in names:
        if name not in SUITES[suite]:
            raise ValueError(f"tasks: {name!r} is not in suite {suite!r}; its tasks: {', '.join(SUITES[suite])}")
    return tuple(dict.fromkeys(names))
