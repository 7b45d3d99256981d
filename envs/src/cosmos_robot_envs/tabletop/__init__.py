"""The embedded MuJoCo tabletop suite: the default, CPU-friendly simulator of cosmos-robot.

Four tasks (reach, push, pick_place, open_drawer) in one scene that ships as code (no downloads),
a LIBERO-like Gymnasium interface, scripted experts that solve every task, and those experts as a
servable ``BasePolicy``. Importing this package registers the ``CosmosRobot/*-v0`` ids.
"""

from cosmos_robot_envs.tabletop.env import ACTION_DIM, OBS_MODES, TabletopEnv
from cosmos_robot_envs.tabletop.expert_policy import ExpertPolicy, expert_input_spec
from cosmos_robot_envs.tabletop.experts import ScriptedExpert, scripted_expert
from cosmos_robot_envs.tabletop.registration import make_env, register_tabletop_envs, resolve_tasks
from cosmos_robot_envs.tabletop.sim import CONTROL_HZ, MAX_POS_STEP, MAX_ROT_STEP
from cosmos_robot_envs.tabletop.tasks import (
    MULTITASK_ENV_ID,
    OBJECT_STATE_DIM,
    OBJECT_STATE_FIELDS,
    STATE_DIM,
    SUITES,
    TASK_NAMES,
    TASKS,
    TaskSpec,
    get_task,
    task_from_prompt,
)

register_tabletop_envs()

__all__ = [
    "ACTION_DIM",
    "CONTROL_HZ",
    "MAX_POS_STEP",
    "MAX_ROT_STEP",
    "MULTITASK_ENV_ID",
    "OBJECT_STATE_DIM",
    "OBJECT_STATE_FIELDS",
    "OBS_MODES",
    "STATE_DIM",
    "SUITES",
    "TASKS",
    "TASK_NAMES",
    "ExpertPolicy",
    "ScriptedExpert",
    "TabletopEnv",
    "TaskSpec",
    "expert_input_spec",
    "get_task",
    "make_env",
    "register_tabletop_envs",
    "resolve_tasks",
    "scripted_expert",
    "task_from_prompt",
]
