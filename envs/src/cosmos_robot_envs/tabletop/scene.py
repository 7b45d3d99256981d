"""The tabletop scene, written as MJCF by code: a floating two-finger gripper, a table and every task object.

Why one scene for all tasks: a multi-task env then has one model, one renderer and one observation
layout, and a policy must read the instruction to know what to do. Objects a task does not use are
parked out of view (behind the agent camera) by the task's reset.

Why MJCF from code: nothing is downloaded at run time (mujoco-menagerie and robot-descriptions fetch
models from the internet), the offscreen buffer is sized to the requested image size, and there is no
mesh or texture to load. The scene is kept to ~35 primitive geoms so a CPU renders it quickly; the
floor is a box, not a plane, because MuJoCo draws an infinite plane as a grid of many quads, which
tripled the render time on llvmpipe.

The gripper is a free body welded to a mocap body (the env moves the mocap target, the weld pulls the
hand along, contacts push back) with gravity compensation, so it neither sags nor drifts. Its two
fingers are slide joints driven together by two position actuators. The hand frame's identity
orientation points the fingers down (-z), so the end-effector axis-angle is ~0 at rest, far from the
pi-wrap where axis-angle jumps.

Physics: 5 ms steps with the implicitfast integrator (10 substeps per control step). Contacts use the
stiffest time constant that step allows (solref 0.01) with high impedance, the weld a lower impedance,
and the fingers carry armature, so contacts win over the weld: with the expert's actions objects
penetrate < 2 mm; random actions ramming the hand into the cabinet can reach ~1 cm for a step.

The reach target's height cue: the target floats 4-25 cm above the table and the renderer draws no
shadows, so without a cue a high, near target and a low, far one on the same agent-camera ray look alike
(the sphere's apparent size is all that differs), and the wrist camera, looking down, never sees a
target above the gripper; a policy trained on images reached 36/42 low targets but 7/38 high ones. So
the target carries a drop-shadow and a stem, both visual only: a dark square on the table straight below
it (its own mocap body, ``target_shadow``, placed by ``TabletopSim.reset``) and a purple stem hanging
from the sphere down into the table (a geom of the ``target`` body; the table hides the part below its
top, so one fixed length serves every height). The square gives the target's table position, the
sphere's image then fixes its height; the wrist camera sees the square too. Both are boxes: llvmpipe's
cost follows triangle count and a box has 12 where a cylinder has ~1,000 (cylinders cost 10-20% of the
step rate). Parked with the target when another task runs. Measured (``MUJOCO_GL=egl .venv/bin/python
benchmarks/reach_observability.py``, 2-core CPU): at 64 px, two targets 17.8 cm apart on one
agent-camera ray differ in 3-15 of 4,096 agent view pixels without the cue (mean 11.4 over 5 pairs) and
27-52 with it (mean 42.2); ``env.step`` with both cameras slows by 2-5% (128 px: 649 -> 631 steps/s; 64
px: 819 -> 801, best of 5 x 300 steps).

Collision groups: static geoms (table, bowl, cabinet) have contype 1 / conaffinity 2 and never collide
with each other; moving geoms (hand, fingers, cubes, drawer) have contype 2 / conaffinity 3.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "BOWL_INNER_RADIUS",
    "CUBE_HALF",
    "DRAWER_RANGE",
    "EEF_OFFSET",
    "FINGER_RANGE",
    "HANDLE_OFFSET",
    "PHYSICS_DT",
    "SHADOW_HALF",
    "STEM_HALF",
    "STEM_LENGTH",
    "build_scene_xml",
]

PHYSICS_DT = 0.005  # s; 10 substeps per 20 Hz control step (implicitfast keeps this stable)
CUBE_HALF = 0.02  # m, half edge of both cubes
FINGER_RANGE = (0.0, 0.04)  # m, each finger's inner face distance from the centre line (closed, open)
EEF_OFFSET = -0.052  # m, the end-effector site below the hand origin (1 cm above the fingertips)
BOWL_RADIUS = 0.07  # m, wall centre radius
BOWL_INNER_RADIUS = 0.064  # m, free radius inside the walls
BOWL_WALL_TOP = 0.05  # m above the table
DRAWER_RANGE = (0.0, 0.16)  # m of travel
HANDLE_OFFSET = np.array([0.05, 0.0, 0.07])  # handle bar centre in the drawer frame (front face at x=0)
# The reach target's height cue (see the module docstring): a stem hanging from the sphere centre, long
# enough to reach into the table from the highest target (25 cm), and a dark square on the table below it.
# Both are boxes: llvmpipe's cost follows triangle count, and a box has 12 where a cylinder has ~1,000.
STEM_HALF = 0.008  # m: 1.6 cm wide is ~1.4 px at 64 px, the least that rasterises unbroken at any slant
STEM_LENGTH = 0.27  # m, from the sphere centre down; the part below the table top is hidden by the table
SHADOW_HALF = 0.027  # m, the square's half side (about the area of a 3 cm radius disc)

_STATIC = 'contype="1" conaffinity="2"'
_MOVING = 'contype="2" conaffinity="3"'
_VISUAL = 'contype="0" conaffinity="0"'

COLORS = {
    "table": "0.78 0.77 0.74 1",
    "floor": "0.25 0.27 0.30 1",
    "palm": "0.28 0.28 0.30 1",
    "finger": "0.12 0.12 0.13 1",
    "red": "0.85 0.08 0.08 1",
    "blue": "0.10 0.25 0.90 1",
    "green": "0.10 0.75 0.20 1",
    "bowl": "0.95 0.70 0.15 1",
    "cabinet": "0.50 0.31 0.17 1",
    "drawer": "0.68 0.46 0.27 1",
    "handle": "0.15 0.15 0.15 1",
    "stem": "0.55 0.12 0.62 1",
    "shadow": "0.10 0.10 0.11 1",
}


def _look_at(pos: np.ndarray, target: np.ndarray) -> str:
    """MJCF ``xyaxes`` for a camera at ``pos`` looking at ``target`` with world +z up."""
    forward = (target - pos) / np.linalg.norm(target - pos)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    return " ".join(f"{v:.5f}" for v in (*right, *up))


def _bowl_geoms() -> str:
    n = 8
    half_len = BOWL_RADIUS * math.tan(math.pi / n) + 0.004
    color = f'rgba="{COLORS["bowl"]}" {_STATIC}'
    parts = [f'<geom name="bowl_bottom" type="cylinder" size="{BOWL_RADIUS + 0.005} 0.005" pos="0 0 0.005" {color}/>']
    for i in range(n):
        a = 2 * math.pi * i / n
        x, y = BOWL_RADIUS * math.cos(a), BOWL_RADIUS * math.sin(a)
        parts.append(
            f'<geom type="box" size="0.005 {half_len:.4f} {BOWL_WALL_TOP / 2 - 0.0025:.4f}" '
            f'pos="{x:.4f} {y:.4f} {BOWL_WALL_TOP / 2 + 0.0025:.4f}" euler="0 0 {a:.5f}" {color}/>'
        )
    return "\n        ".join(parts)


def build_scene_xml(height: int = 128, width: int = 128) -> str:
    """The full MJCF; ``height``/``width`` size the offscreen buffer (kept small for software GL).

    Each part below returns its lines indented for their place in the document.
    """
    world = "\n".join((_room(), _agent_camera(), "", _gripper(), "", _objects(), _cabinet()))
    return f"""
<mujoco model="cosmos_tabletop">
{_settings(height, width)}
  <worldbody>
{world}
  </worldbody>
{_gripper_drive()}
</mujoco>
"""


def _settings(height: int, width: int) -> str:
    """Compiler, physics step, offscreen buffer, lighting and the contact defaults."""
    return f"""  <compiler angle="radian" autolimits="true"/>
  <statistic extent="1" center="0 0 0.1"/>
  <option timestep="{PHYSICS_DT}" integrator="implicitfast"/>
  <visual>
    <global offwidth="{width}" offheight="{height}"/>
    <quality shadowsize="0" offsamples="0"/>
    <headlight ambient="0.3 0.3 0.3" diffuse="0.35 0.35 0.35" specular="0 0 0"/>
    <map znear="0.004" zfar="20"/>
  </visual>
  <default>
    <geom friction="1.0 0.005 0.0001" solref="0.01 1" solimp="0.95 0.99 0.001"/>
  </default>"""


def _room() -> str:
    """The light, the floor and the table."""
    return f"""    <light directional="true" castshadow="false" pos="0 0 2" dir="0.3 0.2 -1" diffuse="0.4 0.4 0.4"
      specular="0 0 0"/>
    <geom name="floor" type="box" size="4 4 0.05" pos="0 0 -0.85" rgba="{COLORS["floor"]}" {_STATIC}/>
    <geom name="table" type="box" size="0.5 0.6 0.4" pos="0 0 -0.4" rgba="{COLORS["table"]}" {_STATIC}/>"""


def _agent_camera() -> str:
    """The fixed third-person camera."""
    # High and steep enough that the whole task workspace (reach targets up to 25 cm high, cubes,
    # bowl, drawer) stays in view: a lower, closer camera cut off targets at the image edges,
    # which capped image-based policies on reach at ~20% success.
    pos = np.array([0.45, 0.0, 0.75])
    axes = _look_at(pos, np.array([-0.02, 0.0, 0.05]))
    return f'    <camera name="agentview" pos="{pos[0]} {pos[1]} {pos[2]}" xyaxes="{axes}" fovy="50"/>'


def _wrist_camera() -> str:
    """The camera on the hand, looking down between the fingers."""
    pos = np.array([0.06, 0.0, -0.01])
    axes = _look_at(pos, np.array([0.0, 0.0, -0.1]))
    return f'      <camera name="wrist" pos="{pos[0]} {pos[1]} {pos[2]}" xyaxes="{axes}" fovy="65"/>'


def _gripper() -> str:
    """The mocap target and the free hand (palm, wrist camera, end-effector site, two slide fingers)."""
    f_lo, f_hi = FINGER_RANGE
    return f"""    <body name="hand_mocap" mocap="true" pos="0 0 0.3"/>
    <body name="hand" pos="0 0 0.3" gravcomp="1">
      <freejoint name="hand_free"/>
      <geom name="palm" type="box" size="0.02 0.055 0.012" mass="0.4" rgba="{COLORS["palm"]}" {_MOVING}/>
      <geom name="wrist" type="cylinder" size="0.022 0.035" pos="0 0 0.047" mass="0.1" rgba="{COLORS["palm"]}"
        {_VISUAL}/>
{_wrist_camera()}
      <site name="eef" pos="0 0 {EEF_OFFSET}" size="0.004" rgba="1 1 1 0" group="5"/>
      <body name="finger_left" pos="0 0.006 -0.037" gravcomp="1">
        <joint name="finger_left" type="slide" axis="0 1 0" range="{f_lo} {f_hi}" damping="16" armature="0.2"/>
        <geom name="finger_left" type="box" size="0.012 0.006 0.025" mass="0.02" condim="4" friction="1.5 0.01 0.001"
          rgba="{COLORS["finger"]}" {_MOVING}/>
      </body>
      <body name="finger_right" pos="0 -0.006 -0.037" gravcomp="1">
        <joint name="finger_right" type="slide" axis="0 -1 0" range="{f_lo} {f_hi}" damping="16" armature="0.2"/>
        <geom name="finger_right" type="box" size="0.012 0.006 0.025" mass="0.02" condim="4"
          friction="1.5 0.01 0.001" rgba="{COLORS["finger"]}" {_MOVING}/>
      </body>
    </body>"""


def _gripper_drive() -> str:
    """What moves the gripper: the weld to its mocap target and the two finger actuators."""
    f_lo, f_hi = FINGER_RANGE
    return f"""  <contact>
    <exclude body1="finger_left" body2="finger_right"/>
  </contact>
  <equality>
    <weld name="hand_weld" body1="hand_mocap" body2="hand" relpose="0 0 0 1 0 0 0" solref="0.01 1"
      solimp="0.6 0.8 0.001"/>
  </equality>
  <actuator>
    <position name="finger_left" joint="finger_left" kp="300" ctrlrange="{f_lo} {f_hi}" forcerange="-12 12"/>
    <position name="finger_right" joint="finger_right" kp="300" ctrlrange="{f_lo} {f_hi}" forcerange="-12 12"/>
  </actuator>"""


def _objects() -> str:
    """The two cubes, the reach target, the push goal and the bowl (parked out of view until a task places them)."""
    return f"""    <body name="red_cube" pos="2 -0.5 -0.78">
      <freejoint name="red_cube"/>
      <geom name="red_cube" type="box" size="{CUBE_HALF} {CUBE_HALF} {CUBE_HALF}" mass="0.05" rgba="{COLORS["red"]}"
        {_MOVING}/>
    </body>
    <body name="blue_cube" pos="2 0.5 -0.78">
      <freejoint name="blue_cube"/>
      <geom name="blue_cube" type="box" size="{CUBE_HALF} {CUBE_HALF} {CUBE_HALF}" mass="0.05"
        rgba="{COLORS["blue"]}" {_MOVING}/>
    </body>
    <body name="target" mocap="true" pos="2 0 0">
      <geom name="target" type="sphere" size="0.02" rgba="{COLORS["red"]}" {_VISUAL}/>
      <geom name="target_stem" type="box" size="{STEM_HALF} {STEM_HALF} {STEM_LENGTH / 2}"
        pos="0 0 {-STEM_LENGTH / 2}" rgba="{COLORS["stem"]}" {_VISUAL}/>
    </body>
    <body name="target_shadow" mocap="true" pos="2 0 0">
      <geom name="target_shadow" type="box" size="{SHADOW_HALF} {SHADOW_HALF} 0.001" pos="0 0 0.001"
        rgba="{COLORS["shadow"]}" {_VISUAL}/>
    </body>
    <body name="goal" mocap="true" pos="2 0 0">
      <geom name="goal" type="cylinder" size="0.05 0.001" pos="0 0 0.001" rgba="{COLORS["green"]}" {_VISUAL}/>
    </body>
    <body name="bowl" mocap="true" pos="2 0 0">
        {_bowl_geoms()}
    </body>"""


def _cabinet() -> str:
    """The cabinet (static walls) and its drawer on a slide joint, with the handle the expert grasps."""
    d_lo, d_hi = DRAWER_RANGE
    hx, hy, hz = HANDLE_OFFSET
    return f"""    <body name="cabinet" mocap="true" pos="2 0 0">
      <geom type="box" size="0.1 0.005 0.065" pos="-0.1 0.125 0.065" rgba="{COLORS["cabinet"]}" {_STATIC}/>
      <geom type="box" size="0.1 0.005 0.065" pos="-0.1 -0.125 0.065" rgba="{COLORS["cabinet"]}" {_STATIC}/>
      <geom type="box" size="0.1 0.13 0.005" pos="-0.1 0 0.125" rgba="{COLORS["cabinet"]}" {_STATIC}/>
      <geom type="box" size="0.005 0.12 0.06" pos="-0.195 0 0.065" rgba="{COLORS["cabinet"]}" {_STATIC}/>
      <body name="drawer">
        <joint name="drawer" type="slide" axis="1 0 0" range="{d_lo} {d_hi}" damping="3" frictionloss="0.3"
          solreflimit="0.01 1" solimplimit="0.95 0.99 0.001"
          armature="0.05"/>
        <geom name="drawer_front" type="box" size="0.005 0.119 0.053" pos="-0.005 0 0.065" density="300"
          rgba="{COLORS["drawer"]}" {_MOVING}/>
        <geom type="box" size="0.085 0.11 0.004" pos="-0.095 0 0.017" density="300" rgba="{COLORS["drawer"]}"
          {_MOVING}/>
        <geom type="box" size="0.085 0.004 0.025" pos="-0.095 0.106 0.04" density="300" rgba="{COLORS["drawer"]}"
          {_MOVING}/>
        <geom type="box" size="0.085 0.004 0.025" pos="-0.095 -0.106 0.04" density="300" rgba="{COLORS["drawer"]}"
          {_MOVING}/>
        <geom type="box" size="0.004 0.11 0.025" pos="-0.176 0 0.04" density="300" rgba="{COLORS["drawer"]}"
          {_MOVING}/>
        <geom name="handle" type="box" size="0.006 0.05 0.006" pos="{hx} {hy} {hz}" density="300"
          rgba="{COLORS["handle"]}" {_MOVING}/>
        <geom type="box" size="{hx / 2:.4f} 0.006 0.006" pos="{hx / 2:.4f} 0.05 {hz}" density="300"
          rgba="{COLORS["handle"]}" {_MOVING}/>
        <geom type="box" size="{hx / 2:.4f} 0.006 0.006" pos="{hx / 2:.4f} -0.05 {hz}" density="300"
          rgba="{COLORS["handle"]}" {_MOVING}/>
      </body>
    </body>"""
