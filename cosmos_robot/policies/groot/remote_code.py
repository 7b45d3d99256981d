"""Refuse GR00T folders that would make LeRobot run code they name, before anything is imported.

Why: a LeRobot GR00T folder names other models by path or hub id (its ``config.json``'s
``base_model_path``, the base's ``model_name`` backbone, the preprocessor's VLM ``model_name``), and
LeRobot 0.6.1 loads every one of them with ``trust_remote_code=True`` (``AutoConfig`` /
``AutoTokenizer``), hard-coded. A folder whose named model carries an ``auto_map`` (transformers'
pointer to Python files shipped with the model) would therefore execute that Python in the server
the moment it is loaded: ``serve --ckpt`` on a downloaded folder is code execution.

So before LeRobot is imported, every model the folder names is resolved to a local folder (a path,
or a hub id already in the Hugging Face cache; fetched, files only, when ``allow_download``) and
its JSON configs are read: any ``auto_map`` is refused, naming the file and the Python modules it
points at, unless the caller opts in with ``trust_remote_code=True`` (``-a trust_remote_code=true``),
which is logged as a warning. A hub id that is not available locally is refused too (we cannot see
what it would run), with the way to fetch it.

Not covered (documented in docs/families.md): a server that is online and passes
``allow_download`` lets transformers re-resolve a hub id after this check (a new revision pushed in
between would not have been inspected); pin local folders for untrusted checkpoints.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import CheckpointError, read_json

__all__ = ["CONFIG_FILES", "DEFAULT_BACKBONE", "check_remote_code", "named_models"]

log = logging.getLogger(__name__)

DEFAULT_BACKBONE = "nvidia/Cosmos-Reason2-2B"  # LeRobot 0.6.1's GROOT_N1_7_BACKBONE_MODEL (when a config names none)
# the configs transformers' Auto* classes read from a model folder (auto_map in any of them runs code)
CONFIG_FILES = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "image_processor_config.json",
    "feature_extractor_config.json",
)


def named_models(root: Path, raw: dict[str, Any], allow_download: bool) -> list[tuple[str, str, Path]]:
    """``(what, where it is named, local folder)`` of every model the GR00T folder ``root`` loads."""
    config = root / "config.json"
    base_ref = raw.get("base_model_path")
    if not isinstance(base_ref, str) or not base_ref:
        raise CheckpointError(f"{config}: 'base_model_path' must name the GR00T base model, got {base_ref!r}")
    base = _local(base_ref, "GR00T base model", f"{config}: base_model_path", allow_download)
    base_config = base / "config.json"
    backbone_ref = read_json(base_config).get("model_name", DEFAULT_BACKBONE) if base_config.is_file() else None
    found = [("GR00T base model", f"{config}: base_model_path", base)]
    if isinstance(backbone_ref, str) and backbone_ref:
        where = f"{base_config}: model_name"
        found.append(("GR00T backbone", where, _local(backbone_ref, "GR00T backbone", where, allow_download)))
    for ref, where in _processor_models(root):
        found.append(("GR00T VLM processor", where, _local(ref, "GR00T VLM processor", where, allow_download)))
    return found


def check_remote_code(root: Path, raw: dict[str, Any], *, trust_remote_code: bool, allow_download: bool) -> None:
    """Refuse (``CheckpointError``) a folder whose named models ship code, unless ``trust_remote_code``."""
    if not isinstance(trust_remote_code, bool):
        raise CheckpointError(f"trust_remote_code must be true or false, got {trust_remote_code!r}")
    for what, where, folder in named_models(root, raw, allow_download):
        for path, modules in _auto_maps(folder):
            if not trust_remote_code:
                raise CheckpointError(
                    f"{path}: the {what} named by {where} ships custom code (auto_map -> {modules}), which "
                    "LeRobot would execute while loading (trust_remote_code); refused. Serve it only if you "
                    "trust its author: -a trust_remote_code=true (Python: trust_remote_code=True)"
                )
            log.warning("trust_remote_code: running the custom code of %s (%s, auto_map -> %s)", what, path, modules)


def _processor_models(root: Path) -> list[tuple[str, str]]:
    """The ``model_name`` of each preprocessor step that builds a transformers processor."""
    path = root / "policy_preprocessor.json"
    found = []
    for i, step in enumerate(read_json(path).get("steps", [])):
        if isinstance(step, dict) and "vlm" in str(step.get("registry_name", "")):
            cfg = step.get("config")
            ref = cfg.get("model_name", DEFAULT_BACKBONE) if isinstance(cfg, dict) else DEFAULT_BACKBONE
            if not isinstance(ref, str) or not ref:
                raise CheckpointError(f"{path}: step {i} model_name must be a path or hub id, got {ref!r}")
            found.append((ref, f"{path}: step {i} ({step['registry_name']}) model_name"))
    return found


def _local(ref: str, what: str, where: str, allow_download: bool) -> Path:
    """The local folder of a model reference: a path, or a hub id from the HF cache (or fetched)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if ref.startswith(("/", ".", "~")) or ref.count("/") != 1:
        raise CheckpointError(
            f"{where} {ref!r} does not exist (nor is it a hub id such as 'org/name'); the {what} is loaded from there"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(ref, local_files_only=not allow_download))
    except (LocalEntryNotFoundError, HFValidationError, OSError) as exc:
        if allow_download:
            raise CheckpointError(f"{where} {ref!r}: the {what} could not be fetched ({exc})") from exc
        raise CheckpointError(
            f"{where} {ref!r}: the {what} is not in the local Hugging Face cache; pass --allow-download "
            "(Python: allow_download=True) to fetch it, or point the config at a local folder"
        ) from exc


def _auto_maps(folder: Path) -> list[tuple[Path, list[str]]]:
    """``(config file, python modules)`` for each config of ``folder`` that has an ``auto_map``."""
    found = []
    for name in CONFIG_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if auto_map:
            targets = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
            flat = [t for v in targets for t in (v if isinstance(v, list) else [v]) if isinstance(t, str)]
            found.append((path, sorted({t.rsplit(".", 1)[0] + ".py" for t in flat})))
    return found
