"""Policies: a model plus input/output transforms and normalisation stats, saved in one folder.

``load_policy_folder(dir)`` rebuilds the identical serving pipeline from the folder alone, whatever the
family (see ``registry``), after checking the folder's files against its ``manifest.json`` when it has one.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import CheckpointError, detect_family, load_policy_class, register_family

__all__ = ["CheckpointError", "detect_family", "load_policy_folder", "register_family"]


def load_policy_folder(ckpt_dir: str | Path, **kwargs: Any) -> Any:
    """Load any supported checkpoint folder as a ``BatchPolicy`` (``infer`` / ``infer_batch``).

    ``kwargs`` go to the family's ``from_pretrained`` (``device`` for all; e.g. ``precision`` and
    ``compile`` for pi05); an option the family does not take is a ``CheckpointError`` listing those it does.
    """
    from cosmos_robot.manifest import verify_manifest

    family = detect_family(ckpt_dir)
    verify_manifest(ckpt_dir)  # an exported folder's files must match its manifest.json (none: unverified)
    cls = load_policy_class(family)
    params = inspect.signature(cls.from_pretrained).parameters
    accepted = [name for name in params if name != "ckpt_dir"]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise CheckpointError(f"the {family} family does not take option(s) {unknown}; it takes {accepted}")
    return cls.from_pretrained(ckpt_dir, **kwargs)
