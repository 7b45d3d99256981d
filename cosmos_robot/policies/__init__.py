"""Policies: a model plus input/output transforms and normalisation stats, saved in one folder.

``load_policy_folder(dir)`` rebuilds the identical serving pipeline from the folder alone, whatever the
family (see ``registry``), after checking the folder's files against its ``manifest.json`` when it has one.
The manifest is checked first, before any file is parsed: a corrupted ``config.json`` or weight file is
then reported as what it is (a file that differs from the export), naming the file.

Serving loads folders that may be broken or hostile, so the loader is where that is settled: every
failure is a ``CheckpointError`` naming the folder (the families name the file, key or tensor), never
a raw traceback; nothing is downloaded unless ``allow_download=True`` (``serve --allow-download``); and
the families that can reach code named by a checkpoint (GR00T's base and backbone models) refuse
remote code unless ``trust_remote_code=True`` is passed explicitly.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import (
    CheckpointError,
    detect_family,
    get_family,
    load_policy_class,
    register_family,
)

__all__ = ["CheckpointError", "detect_family", "load_policy_folder", "register_family"]

# errors a family's loader may let through from torch, safetensors, transformers or LeRobot on a bad folder
_LOAD_ERRORS = (OSError, RuntimeError, KeyError, TypeError, IndexError, AttributeError, MemoryError, ImportError)


def load_policy_folder(
    ckpt_dir: str | Path, *, allow_download: bool = False, serving: bool = False, **kwargs: Any
) -> Any:
    """Load any supported checkpoint folder as a ``BatchPolicy`` (``infer`` / ``infer_batch``).

    ``kwargs`` go to the family's ``from_pretrained`` (``device`` for all; e.g. ``precision`` and
    ``compile`` for pi05); an option the family does not take is a ``CheckpointError`` listing those it does.
    ``allow_download`` goes to the families that may fetch files from the Hugging Face hub (a pi05
    tokenizer, a GR00T base model); the others never download, so it changes nothing for them.
    ``serving`` (``serve --ckpt``, ``eval --ckpt``) adds the family's ``serve_options`` under ``kwargs``.
    """
    from cosmos_robot.manifest import verify_manifest

    verify_manifest(ckpt_dir)  # an exported folder's files must match its manifest.json (none: unverified)
    family = detect_family(ckpt_dir)
    if serving:
        kwargs = {**dict(get_family(family).serve_options), **kwargs}
    cls = load_policy_class(family)
    params = inspect.signature(cls.from_pretrained).parameters
    accepted = [name for name in params if name not in ("ckpt_dir", "allow_download")]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise CheckpointError(f"the {family} family does not take option(s) {unknown}; it takes {accepted}")
    if "allow_download" in params:
        kwargs["allow_download"] = allow_download
    try:
        return cls.from_pretrained(ckpt_dir, **kwargs)
    except CheckpointError:
        raise
    except _LOAD_ERRORS as exc:  # a library error the family did not anticipate: still name the folder
        raise CheckpointError(f"{ckpt_dir}: the {family} loader failed: {type(exc).__name__}: {exc}") from exc
