"""The MuJoCo side of the tabletop env: model/data, the action-to-mocap mapping, state readouts.

Kept apart from the gymnasium class so the control law (LIBERO-style 7-D delta end-effector actions at
20 Hz) is in one place, and tests and the expert's documentation can refer to its constants.

Action mapping, per 20 Hz step (``a`` already clipped to [-1, 1]):

- position: the end-effector target moves by ``a[:3] * MAX_POS_STEP`` metres (world frame), then is
  clipped to within ``MAX_LEAD`` of the measured end-effector (so pressing against the table or a
  drawer stop cannot wind up a far-away target) and to the ``WORKSPACE`` box;
- rotation: the target orientation turns by the rotation vector ``a[3:6] * MAX_ROT_STEP`` radians,
  applied in the world frame (like robosuite's OSC controller that LIBERO uses), and is kept within
  ``MAX_ROT_LEAD`` of the measured orientation for the same reason;
- gripper: ``a[6]`` in [-1, 1] maps linearly to the finger opening, -1 fully open, +1 closed (LIBERO's
  sign convention); the position actuators stop on whatever is in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from cosmos_robot_envs.tabletop.rotations import (
    axis_angle_to_quat,
    quat_conj,
    quat_mul,
    quat_to_axis_angle,
    quat_to_mat,
    yaw_quat,
)
from cosmos_robot_envs.tabletop.scene import (
    CUBE_HALF,
    DRAWER_RANGE,
    EEF_OFFSET,
    FINGER_RANGE,
    PHYSICS_DT,
    build_scene_xml,
)

__all__ = [
    "CONTROL_DT",
    "CONTROL_HZ",
    "MAX_LEAD",
    "MAX_POS_STEP",
    "MAX_ROT_STEP",
    "WORKSPACE_HIGH",
    "WORKSPACE_LOW",
    "Layout",
    "TabletopSim",
]

CONTROL_HZ = 20
CONTROL_DT = 1.0 / CONTROL_HZ
N_SUBSTEPS = round(CONTROL_DT / PHYSICS_DT)
MAX_POS_STEP = 0.02  # m per control step at |action| = 1 (0.4 m/s)
MAX_ROT_STEP = 0.2  # rad per control step at |action| = 1 (4 rad/s)
MAX_LEAD = 0.04  # m, how far the commanded target may run ahead of the measured end-effector
MAX_ROT_LEAD = 0.3  # rad, the same bound for the commanded orientation
WORKSPACE_LOW = np.array([-0.35, -0.35, 0.01])  # end-effector target box (m); z=0.01 puts fingertips on the table
WORKSPACE_HIGH = np.array([0.35, 0.35, 0.40])
_EEF_IN_HAND = np.array([0.0, 0.0, EEF_OFFSET])
_PARK_CUBE = {"red_cube": np.array([2.0, -0.5, -0.78]), "blue_cube": np.array([2.0, 0.5, -0.78])}
_PARK_MOCAP = {"target": (2.0, 0.0), "goal": (2.5, 0.0), "bowl": (3.0, 0.0), "cabinet": (3.5, 0.0)}


@dataclass
class Layout:
    """An initial state. ``None`` parks an object out of view; cubes are ``(x, y, yaw)`` on the table."""

    eef_pos: np.ndarray
    red_cube: tuple[float, float, float] | None = None
    blue_cube: tuple[float, float, float] | None = None
    target: np.ndarray | None = None
    goal: np.ndarray | None = None
    bowl: np.ndarray | None = None
    cabinet: np.ndarray | None = None
    drawer_opening: float = 0.0


class TabletopSim:
    """Model, data and readouts for one scene; rendering is the env's business."""

    def __init__(self, height: int = 128, width: int = 128) -> None:
        self.model = mujoco.MjModel.from_xml_string(build_scene_xml(height, width))
        self.data = mujoco.MjData(self.model)
        m = self.model
        self._mocap = {
            name: int(m.body_mocapid[m.body(name).id]) for name in ("hand_mocap", "target_shadow", *_PARK_MOCAP)
        }
        self._qadr = {name: int(m.jnt_qposadr[m.joint(name).id]) for name in ("hand_free", "red_cube", "blue_cube")}
        self._drawer_qadr = int(m.jnt_qposadr[m.joint("drawer").id])
        self._finger_qadr = [int(m.jnt_qposadr[m.joint(n).id]) for n in ("finger_left", "finger_right")]
        self._eef_site = m.site("eef").id
        self._handle_geom = m.geom("handle").id
        self.finger_geoms = frozenset({m.geom("finger_left").id, m.geom("finger_right").id})
        self.cube_geoms = {name: m.geom(name).id for name in ("red_cube", "blue_cube")}
        self.target_pos: np.ndarray = np.zeros(3)
        self.target_quat = np.array([1.0, 0.0, 0.0, 0.0])

    # ------------------------------------------------------------------ reset / step
    def reset(self, layout: Layout) -> None:
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        self.target_pos = np.asarray(layout.eef_pos, dtype=np.float64).copy()
        self.target_quat = np.array([1.0, 0.0, 0.0, 0.0])
        hand = self.target_pos - _EEF_IN_HAND
        d.qpos[self._qadr["hand_free"] : self._qadr["hand_free"] + 7] = [*hand, 1.0, 0.0, 0.0, 0.0]
        d.mocap_pos[self._mocap["hand_mocap"]] = hand
        d.mocap_quat[self._mocap["hand_mocap"]] = self.target_quat
        for adr in self._finger_qadr:
            d.qpos[adr] = FINGER_RANGE[1]
        d.ctrl[:] = FINGER_RANGE[1]
        for name in ("red_cube", "blue_cube"):
            pose = getattr(layout, name)
            adr = self._qadr[name]
            if pose is None:
                d.qpos[adr : adr + 7] = [*_PARK_CUBE[name], 1.0, 0.0, 0.0, 0.0]
            else:
                x, y, yaw = pose
                d.qpos[adr : adr + 7] = [x, y, CUBE_HALF, *yaw_quat(yaw)]
        for name, park in _PARK_MOCAP.items():
            pos = getattr(layout, name)
            idx = self._mocap[name]
            d.mocap_pos[idx] = [park[0], park[1], 0.0] if pos is None else pos
        # the target's drop shadow lies on the table straight below it (its stem moves with the target body)
        d.mocap_pos[self._mocap["target_shadow"]] = [*d.mocap_pos[self._mocap["target"]][:2], 0.0]
        d.qpos[self._drawer_qadr] = np.clip(layout.drawer_opening, *DRAWER_RANGE)
        mujoco.mj_forward(m, d)

    def apply_action(self, action: np.ndarray) -> None:
        """Advance one 20 Hz control step with an already-validated action in [-1, 1]^7."""
        d = self.data
        eef = self.eef_pos()
        target = self.target_pos + action[:3] * MAX_POS_STEP
        target = np.clip(target, eef - MAX_LEAD, eef + MAX_LEAD)
        self.target_pos = np.clip(target, WORKSPACE_LOW, WORKSPACE_HIGH)
        dq = axis_angle_to_quat(action[3:6] * MAX_ROT_STEP)
        quat = quat_mul(dq, self.target_quat)
        current = self.eef_quat()
        lead = quat_to_axis_angle(quat_mul(quat, quat_conj(current)))
        angle = float(np.linalg.norm(lead))
        if angle > MAX_ROT_LEAD:
            quat = quat_mul(axis_angle_to_quat(lead * (MAX_ROT_LEAD / angle)), current)
        self.target_quat = quat / np.linalg.norm(quat)
        idx = self._mocap["hand_mocap"]
        d.mocap_quat[idx] = self.target_quat
        d.mocap_pos[idx] = self.target_pos - quat_to_mat(self.target_quat) @ _EEF_IN_HAND
        lo, hi = FINGER_RANGE
        d.ctrl[:] = lo + (hi - lo) * (1.0 - float(action[6])) / 2.0
        mujoco.mj_step(self.model, d, nstep=N_SUBSTEPS)

    # ------------------------------------------------------------------ readouts
    def eef_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._eef_site].copy()

    def eef_quat(self) -> np.ndarray:
        quat = np.empty(4)
        mujoco.mju_mat2Quat(quat, self.data.site_xmat[self._eef_site])
        return quat

    def fingers(self) -> np.ndarray:
        return self.data.qpos[self._finger_qadr].copy()

    def state(self) -> np.ndarray:
        """The 8-D proprio state: eef position, eef axis-angle, two finger openings."""
        return np.concatenate([self.eef_pos(), quat_to_axis_angle(self.eef_quat()), self.fingers()]).astype(np.float32)

    def cube_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        adr = self._qadr[name]
        return self.data.qpos[adr : adr + 3].copy(), self.data.qpos[adr + 3 : adr + 7].copy()

    def mocap_pos(self, name: str) -> np.ndarray:
        return self.data.mocap_pos[self._mocap[name]].copy()

    def drawer_opening(self) -> float:
        return float(self.data.qpos[self._drawer_qadr])

    def handle_pos(self) -> np.ndarray:
        return self.data.geom_xpos[self._handle_geom].copy()

    def touching(self, geoms_a: frozenset[int], geom_b: int) -> bool:
        """Whether any geom in ``geoms_a`` is in contact with ``geom_b`` right now."""
        d = self.data
        for i in range(d.ncon):
            g1, g2 = int(d.contact.geom1[i]), int(d.contact.geom2[i])
            if (g1 in geoms_a and g2 == geom_b) or (g2 in geoms_a and g1 == geom_b):
                return True
        return False
