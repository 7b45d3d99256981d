"""``EnvFactory``: an env id plus keyword arguments, a recipe for an env that travels as plain data.

Why a dataclass in a module of its own: a worker process or Ray actor needs a callable that builds its
env. An env id plus keyword arguments is data (no code), so it crosses to a ``spawn``/``forkserver``
worker by reference, and the worker imports the module that registers the id (gymnasium ids such as
``gym_pusht/PushT-v0`` only exist after their package is imported). The worker back ends
(``subproc``, ``external``) import it from here, and ``factory.make_vector_env`` imports them: no cycle.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["EnvFactory"]

# gymnasium namespaces whose registering module is not the namespace itself
_NAMESPACE_MODULES = {"CosmosRobot": "cosmos_robot_envs.tabletop", "Libero": "cosmos_robot_envs.libero"}


@dataclass(frozen=True)
class EnvFactory:
    """``gymnasium.make(env_id, **kwargs)``, importing the package that registers ``env_id`` first.

    ``python``: run this env's worker under that interpreter (another venv; see
    :mod:`cosmos_robot_envs.vector.external`); only the ``"async"`` mode can, and ``kwargs`` must then
    be plain data (msgpack). None: the current interpreter.
    """

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    python: str | None = None

    def __call__(self) -> gym.Env[Any, Any]:
        env_id = self.env_id
        if ":" not in env_id and "/" in env_id:
            namespace = env_id.split("/", 1)[0]
            if namespace not in {spec.namespace for spec in gym.registry.values()}:
                module = _NAMESPACE_MODULES.get(namespace, namespace)
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    raise gym.error.NamespaceNotFound(
                        f"env id {env_id!r}: namespace {namespace!r} is not registered and module {module!r} "
                        f"cannot be imported ({exc})"
                    ) from exc
        return gym.make(env_id, **self.kwargs)
