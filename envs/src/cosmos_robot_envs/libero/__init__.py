"""LIBERO (Liu et al., NeurIPS D&B 2023) behind the project's env layer: ``Libero/Libero-v0``.

LIBERO runs in its own venv (``.venv-libero``, built by ``make libero``) because robosuite 1.4.0
needs a mujoco older than the one the rest of the stack uses; :func:`libero_python` finds that
interpreter and the vector layer starts the env workers under it. Importing this package does not
import LIBERO, robosuite or mujoco: the parent process only schedules and batches. See
``docs/libero.md``.
"""

from __future__ import annotations

import gymnasium as gym

from cosmos_robot_envs.libero.locate import LiberoNotFound, libero_catalog, libero_python

__all__ = ["ENV_ID", "LiberoNotFound", "libero_catalog", "libero_python"]

ENV_ID = "Libero/Libero-v0"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="cosmos_robot_envs.libero.env:LiberoEnv")
