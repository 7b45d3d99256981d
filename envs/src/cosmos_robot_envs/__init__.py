"""cosmos-robot-envs: Gymnasium robot envs, the vector layer and headless evaluation.

Importing the package registers the embedded tabletop suite's gymnasium ids
(``CosmosRobot/Reach-v0``, ``Push-v0``, ``PickPlace-v0``, ``OpenDrawer-v0``, ``Tabletop-v0``), so
``import cosmos_robot_envs; gym.make("CosmosRobot/Push-v0")`` works, as does
``gym.make("cosmos_robot_envs:CosmosRobot/Push-v0")`` without the explicit import.

Headless by default: without a display and without an explicit ``MUJOCO_GL``, rendering uses
EGL (MuJoCo reads the variable when it is first imported, and worker processes inherit it), so
``cosmos-robot eval`` / ``record`` / ``train`` render on a server with no extra setup.
"""

import os

if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
    os.environ["MUJOCO_GL"] = "egl"

from cosmos_robot_envs.tabletop import (  # after choosing the GL backend
    SUITES,
    TASK_NAMES,
    TASKS,
    ExpertPolicy,
    TabletopEnv,
    TaskSpec,
    make_env,
    resolve_tasks,
    scripted_expert,
)

__all__ = [
    "SUITES",
    "TASKS",
    "TASK_NAMES",
    "ExpertPolicy",
    "TabletopEnv",
    "TaskSpec",
    "make_env",
    "resolve_tasks",
    "scripted_expert",
]
