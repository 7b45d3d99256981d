"""cosmos-robot-envs: Gymnasium robot envs, the vector layer and headless evaluation.

Importing the package registers the embedded tabletop suite's gymnasium ids
(``CosmosRobot/Reach-v0``, ``Push-v0``, ``PickPlace-v0``, ``OpenDrawer-v0``, ``Tabletop-v0``), so
``import cosmos_robot_envs; gym.make("CosmosRobot/Push-v0")`` works, as does
``gym.make("cosmos_robot_envs:CosmosRobot/Push-v0")`` without the explicit import.
"""

from cosmos_robot_envs.tabletop import (
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
