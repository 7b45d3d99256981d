"""Demonstrations: scripted-expert rollouts recorded as LeRobot datasets, and loading them for training.

``record_demonstrations`` (``cosmos-robot record``) writes a LeRobot v3 dataset; ``load_demonstrations``
reads one back into in-memory tensors with action chunks. Importing this package does not import LeRobot
or torch; they load when a function that needs them is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cosmos_robot.data.schema import ACTION, CAMERAS, FPS, OBJECT_STATE, ROBOT_TYPE, SIDECAR, STATE, camera_key

if TYPE_CHECKING:
    from cosmos_robot.data.loader import DemoData, action_chunks, compute_norm_stats, load_demonstrations
    from cosmos_robot.data.record import RecordCallbacks, RecordConfig, load_sidecar, record_demonstrations
    from cosmos_robot.data.rollouts import demo_seed

__all__ = [
    "ACTION",
    "CAMERAS",
    "FPS",
    "OBJECT_STATE",
    "ROBOT_TYPE",
    "SIDECAR",
    "STATE",
    "DemoData",
    "RecordCallbacks",
    "RecordConfig",
    "action_chunks",
    "camera_key",
    "compute_norm_stats",
    "demo_seed",
    "load_demonstrations",
    "load_sidecar",
    "record_demonstrations",
]

_LAZY = {
    "DemoData": "cosmos_robot.data.loader",
    "action_chunks": "cosmos_robot.data.loader",
    "compute_norm_stats": "cosmos_robot.data.loader",
    "load_demonstrations": "cosmos_robot.data.loader",
    "RecordCallbacks": "cosmos_robot.data.record",
    "RecordConfig": "cosmos_robot.data.record",
    "load_sidecar": "cosmos_robot.data.record",
    "record_demonstrations": "cosmos_robot.data.record",
    "demo_seed": "cosmos_robot.data.rollouts",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cosmos_robot.data' has no attribute {name!r}")
