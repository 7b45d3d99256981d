"""Task catalogue of the tabletop suite: names, instructions, max_steps, gymnasium ids, observation layout.

Pure data with no MuJoCo import, so registration and CLIs (``--suite tabletop --tasks reach,push``)
can list tasks without building a simulator.

``object_state`` (15 floats, the same layout for every task so a multi-task env has one observation
space) carries what a state-based policy or the scripted expert needs:

====== =====================================================================================
index  meaning
====== =====================================================================================
0:3    object position (m, world): reach target / blue cube / red cube / drawer handle centre
3:7    object orientation quaternion (w, x, y, z); identity for the target and the handle
7:10   goal position (m, world): the target itself / green goal centre / bowl centre on the
       table / the handle centre once the drawer is open by the success threshold
10     drawer opening (m), 0 for the other tasks
11:15  one-hot task id in ``TASK_NAMES`` order (reach, push, pick_place, open_drawer)
====== =====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "OBJECT_STATE_DIM",
    "OBJECT_STATE_FIELDS",
    "STATE_DIM",
    "STATE_FIELDS",
    "SUITES",
    "TASKS",
    "TASK_NAMES",
    "TaskSpec",
    "MULTITASK_ENV_ID",
    "get_task",
    "task_from_prompt",
]


@dataclass(frozen=True)
class TaskSpec:
    """One task: its instruction (the ``prompt``), episode length ``max_steps`` at 20 Hz and gymnasium id."""

    name: str
    instruction: str
    max_steps: int
    env_id: str
    summary: str


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "reach",
            "reach the red target",
            100,
            "CosmosRobot/Reach-v0",
            "move the gripper (end-effector site) within 3 cm of a red sphere floating 4-25 cm above the table "
            "(a stem down to a dark square on the table below it shows its height)",
        ),
        TaskSpec(
            "push",
            "push the blue cube to the green goal",
            160,
            "CosmosRobot/Push-v0",
            "slide the blue cube until its centre is within 4 cm of the green disc's centre",
        ),
        TaskSpec(
            "pick_place",
            "put the red cube in the bowl",
            200,
            "CosmosRobot/PickPlace-v0",
            "grasp the red cube, drop it inside the yellow bowl and let go (no finger touching it)",
        ),
        TaskSpec(
            "open_drawer",
            "open the drawer",
            120,
            "CosmosRobot/OpenDrawer-v0",
            "pull the drawer out by at least 12 cm",
        ),
    )
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
SUITES: dict[str, tuple[str, ...]] = {"tabletop": TASK_NAMES}
MULTITASK_ENV_ID = "CosmosRobot/Tabletop-v0"

STATE_FIELDS = ("eef_x", "eef_y", "eef_z", "eef_ax", "eef_ay", "eef_az", "finger_left", "finger_right")
STATE_DIM = len(STATE_FIELDS)
OBJECT_STATE_FIELDS = (
    ("object_pos", 0, 3),
    ("object_quat", 3, 7),
    ("goal_pos", 7, 10),
    ("drawer_opening", 10, 11),
    ("task_onehot", 11, 11 + len(TASK_NAMES)),
)
OBJECT_STATE_DIM = OBJECT_STATE_FIELDS[-1][2]


def get_task(name: str) -> TaskSpec:
    """The spec for ``name``; an unknown name raises with the list of known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task: unknown tabletop task {name!r}; known tasks: {', '.join(TASK_NAMES)}") from None


def task_from_prompt(prompt: str) -> str:
    """The task whose instruction is ``prompt`` (case and surrounding space ignored)."""
    wanted = prompt.strip().lower()
    for spec in TASKS.values():
        if spec.instruction == wanted:
            return spec.name
    known = "; ".join(repr(s.instruction) for s in TASKS.values())
    raise ValueError(f"prompt: {prompt!r} is not a tabletop instruction (known: {known})")
