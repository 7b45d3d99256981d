"""Policies: a model plus input/output transforms and normalisation stats, saved in one folder.

``load_policy(dir)`` rebuilds the identical serving pipeline from the folder alone, whatever the
family (see ``registry``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import CheckpointError, detect_family, load_policy_class, register_family

__all__ = ["CheckpointError", "detect_family", "load_policy", "register_family"]


def load_policy(ckpt_dir: str | Path, **kwargs: Any) -> Any:
    """Load any supported checkpoint folder as a ``BatchPolicy`` (``infer`` / ``infer_batch``)."""
    family = detect_family(ckpt_dir)
    cls = load_policy_class(family)
    return cls.from_pretrained(ckpt_dir, **kwargs)
