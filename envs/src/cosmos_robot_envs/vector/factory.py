"""One entry point, :func:`make_vector_env`, over the sync, async (processes) and Ray back ends.

``EnvFactory`` (env id + kwargs as plain data) lives in ``env_factory``; the back ends are imported
only when a mode asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym

from cosmos_robot_envs.vector.base import BatchedEnv
from cosmos_robot_envs.vector.env_factory import EnvFactory
from cosmos_robot_envs.vector.runner import EnvFn

__all__ = ["EnvFactory", "Mode", "make_vector_env"]

Mode = Literal["sync", "async", "ray"]


def make_vector_env(
    env: str | EnvFn | Sequence[EnvFn],
    num_envs: int | None = None,
    mode: Mode = "sync",
    *,
    env_kwargs: dict[str, Any] | None = None,
    step_timeout: float | None = 60.0,
    reset_timeout: float | None = 120.0,
    start_method: str | None = None,
    ray_actor_options: dict[str, Any] | None = None,
) -> BatchedEnv:
    """Build ``num_envs`` envs behind one :class:`BatchedEnv`.

    ``env``: a gymnasium id (with ``env_kwargs``), one factory used for every env, or one factory per
    env. ``mode``: ``"sync"`` (in-process), ``"async"`` (a process per env, shared memory, crash and
    hang recovery) or ``"ray"`` (a Ray actor per env). ``step_timeout`` / ``reset_timeout``: seconds
    before a silent worker counts as hung (None waits forever; ignored by ``"sync"``);
    ``reset_timeout`` also bounds a restarted worker's start-up (the first start of ``"async"`` workers
    waits at least 120 s: imports and the first env build). ``start_method``: ``"forkserver"`` (default on
    Linux) or ``"spawn"`` for ``"async"``. ``ray_actor_options``: passed to ``ray.remote`` (default
    ``{"num_cpus": 1}``).

    Example::

        venv = make_vector_env("CartPole-v1", num_envs=4, mode="async")
        obs, infos = venv.reset(seeds=0)
        obs, rewards, terminated, truncated, infos = venv.step(venv.action_space.sample())
        obs, infos = venv.reset(seeds=100, mask=terminated | truncated)  # only the finished envs
    """
    fns = _env_fns(env, num_envs, env_kwargs)
    foreign = sorted({f.python for f in fns if isinstance(f, EnvFactory) and f.python})
    if foreign and mode != "async":
        raise ValueError(
            f"mode={mode!r}: these envs run under another interpreter ({', '.join(foreign)}), "
            "which only mode='async' supports (one worker process per env)"
        )
    if mode == "sync":
        from cosmos_robot_envs.vector.sync import SyncBatchedEnv

        return SyncBatchedEnv(fns)
    if mode == "async":
        from cosmos_robot_envs.vector.subproc import AsyncBatchedEnv

        return AsyncBatchedEnv(fns, step_timeout=step_timeout, reset_timeout=reset_timeout, start_method=start_method)
    if mode == "ray":
        from cosmos_robot_envs.vector.ray_env import RayBatchedEnv

        return RayBatchedEnv(
            fns, step_timeout=step_timeout, reset_timeout=reset_timeout, actor_options=ray_actor_options
        )
    raise ValueError(f"mode must be 'sync', 'async' or 'ray', got {mode!r}")


def _env_fns(
    env: str | EnvFn | Sequence[EnvFn], num_envs: int | None, env_kwargs: dict[str, Any] | None
) -> list[EnvFn]:
    if num_envs is not None and num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if isinstance(env, str):
        if num_envs is None:
            raise ValueError("num_envs is required when env is an id string")
        return [EnvFactory(env, dict(env_kwargs or {}))] * num_envs
    if env_kwargs:
        raise ValueError("env_kwargs only applies to an env id string; bind them into your factory instead")
    if callable(env):
        if num_envs is None:
            raise ValueError("num_envs is required when env is a single factory")
        one: Callable[[], gym.Env[Any, Any]] = env
        return [one] * num_envs
    fns = list(env)
    if num_envs is not None and num_envs != len(fns):
        raise ValueError(f"num_envs={num_envs} but {len(fns)} env factories were given")
    if not all(callable(f) for f in fns):
        raise TypeError("env must be an id string, a factory, or a sequence of factories")
    return fns
