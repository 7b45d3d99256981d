"""The output folder: what lives in it, and when a run may resume into it.

Why refuse a differing config: resuming appends episodes to the JSONL, so a run with another seed,
task list or policy would silently mix two experiments into one success rate. Only fields that
cannot change any episode's outcome (``RUNTIME_FIELDS``: env count, vector mode, batching) may
differ. ``overwrite=True`` deletes exactly the files an eval writes, never the folder itself (the user
might have pointed ``--out`` at a folder holding other things).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cosmos_robot_envs.eval.config import EvalConfig, config_mismatch
from cosmos_robot_envs.eval.report import LATENCY_PNG, REPORT_HTML, RESULTS_JSON, SUCCESS_PNG

__all__ = ["CONFIG_JSON", "EPISODES_JSONL", "INFRA_JSONL", "VIDEO_DIR", "ConfigMismatchError", "prepare_out_dir"]

CONFIG_JSON = "config.json"
EPISODES_JSONL = "episodes.jsonl"
INFRA_JSONL = "infra_failures.jsonl"  # attempts lost to failed simulator workers (not episodes)
VIDEO_DIR = "videos"
_OUTPUTS = (CONFIG_JSON, EPISODES_JSONL, INFRA_JSONL, RESULTS_JSON, REPORT_HTML, SUCCESS_PNG, LATENCY_PNG)


class ConfigMismatchError(ValueError):
    """The output folder holds a run with another config; the message names the differing fields."""


def prepare_out_dir(out_dir: Path, config: EvalConfig, *, overwrite: bool = False) -> None:
    """Create ``out_dir`` (or clear our files in it with ``overwrite``), check and save ``config.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in _OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)
        shutil.rmtree(out_dir / VIDEO_DIR, ignore_errors=True)
    saved_path = out_dir / CONFIG_JSON
    if saved_path.exists():
        try:
            saved = json.loads(saved_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigMismatchError(
                f"{saved_path} is not valid JSON ({exc}); pass --overwrite to start fresh"
            ) from exc
        diffs = config_mismatch(saved, config)
        if diffs:
            raise ConfigMismatchError(
                f"{out_dir} holds a run with a different config, refusing to resume into it: "
                + "; ".join(diffs)
                + ". Use another --out, or --overwrite to delete that run and start fresh."
            )
    elif (out_dir / EPISODES_JSONL).exists():
        raise ConfigMismatchError(
            f"{out_dir / EPISODES_JSONL} exists without {CONFIG_JSON}; cannot tell which run it belongs to. "
            "Use another --out, or --overwrite to start fresh."
        )
    saved_path.write_text(json.dumps(config.to_dict(), indent=2, default=str) + "\n")
