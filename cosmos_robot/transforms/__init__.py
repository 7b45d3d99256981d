"""Transforms at the edge: small frozen dataclasses ``__call__(dict) -> dict``, saved by name.

A policy is ``input transforms -> model -> output transforms``; robot/benchmark layouts (openpi
keys, GR00T ``video.*``/``state.*``, DROID joints) are converted here, never inside models.
Every transform serialises to ``{"name": ..., **fields}`` so a checkpoint folder rebuilds the
identical pipeline (``transforms_to_config`` / ``transforms_from_config``).
"""

from cosmos_robot.transforms.base import (
    Transform,
    register_transform,
    run_transforms,
    transforms_from_config,
    transforms_to_config,
)
from cosmos_robot.transforms.common import (
    BinarizeActions,
    NormalizeKeys,
    PadOrSliceActions,
    RenameKeys,
    ResizeImages,
    SelectKeys,
    UnnormalizeKeys,
)
from cosmos_robot.transforms.vectors import ConcatKeys

__all__ = [
    "BinarizeActions",
    "ConcatKeys",
    "NormalizeKeys",
    "PadOrSliceActions",
    "RenameKeys",
    "ResizeImages",
    "SelectKeys",
    "Transform",
    "UnnormalizeKeys",
    "register_transform",
    "run_transforms",
    "transforms_from_config",
    "transforms_to_config",
]
