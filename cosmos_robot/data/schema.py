"""The feature layout of a tabletop demonstration dataset, shared by the recorder and the loader.

Why one module: the recorder writes these LeRobot feature names and the loader (and the flow policy's
wire mapping) reads them back; a renamed key must break at one place, not silently at three.

Layout (LeRobot v3 conventions; LeRobot adds ``timestamp``, ``frame_index``, ``episode_index``,
``index`` and ``task_index`` itself, and the instruction is the per-frame ``task`` string):

================================ ======= ============ ==================================================
feature                          dtype   shape        meaning
================================ ======= ============ ==================================================
``observation.images.image``     image   (S, S, 3)    agent-view camera, uint8 RGB (``video`` with --videos)
``observation.images.wrist_image`` image (S, S, 3)    wrist camera
``observation.state``            float32 (8,)         end-effector position (3), axis-angle (3), fingers (2)
``observation.object_state``     float32 (15,)        PRIVILEGED simulator state (object pose, goal, drawer
                                                      opening, task one-hot): kept for RL critics and
                                                      analysis; a deployable policy must not read it
``action``                       float32 (7,)         the expert's command at this frame: position delta (3),
                                                      rotation delta (3), gripper (1), all in [-1, 1]
================================ ======= ============ ==================================================

Frame ``t`` pairs the observation *before* step ``t`` with the action taken at ``t``; the observation
after the last action is not stored (LeRobot's convention).
"""

from __future__ import annotations

from typing import Any

from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_FIELDS, STATE_FIELDS

FPS = 20  # the tabletop control rate
ROBOT_TYPE = "cosmos_robot_tabletop_gripper"
CAMERAS = ("image", "wrist_image")  # env observation keys of the two cameras
STATE = "observation.state"
OBJECT_STATE = "observation.object_state"
ACTION = "action"
ACTION_NAMES = ("dx", "dy", "dz", "drx", "dry", "drz", "gripper")
SIDECAR = "meta/cosmos_robot.json"  # our per-dataset record: seeds, command, failures (see record.py)


def camera_key(camera: str) -> str:
    """``"image"`` -> ``"observation.images.image"`` (LeRobot's camera feature name)."""
    return f"observation.images.{camera}"


def _object_state_names() -> list[str]:
    names: list[str] = []
    for field, start, stop in OBJECT_STATE_FIELDS:
        if stop - start == 1:
            names.append(field)
        else:
            names.extend(f"{field}_{i}" for i in range(stop - start))
    return names


def demo_features(image_size: int, use_videos: bool = False) -> dict[str, dict[str, Any]]:
    """The ``features`` argument of ``LeRobotDataset.create`` for tabletop demonstrations."""
    visual = "video" if use_videos else "image"
    features: dict[str, dict[str, Any]] = {
        camera_key(cam): {
            "dtype": visual,
            "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
        for cam in CAMERAS
    }
    features[STATE] = {"dtype": "float32", "shape": (len(STATE_FIELDS),), "names": list(STATE_FIELDS)}
    object_names = _object_state_names()
    features[OBJECT_STATE] = {"dtype": "float32", "shape": (len(object_names),), "names": object_names}
    features[ACTION] = {"dtype": "float32", "shape": (len(ACTION_NAMES),), "names": list(ACTION_NAMES)}
    return features
