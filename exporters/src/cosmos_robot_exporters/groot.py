"""``groot`` -> a GR00T N1.7 checkpoint: a base folder with its action head replaced by the trained one.

The semantics of cosmos-framework's GR00T export (an action-head export): start from a *base*
checkpoint that matches the trained model, replace its action-head tensors (``action_head.*``: the VL
adapter, the DiT, the state/action encoders and decoder) with the trained ones, and keep everything
else of the base as it is:

- the trained action head must have exactly the base's tensor names and shapes: missing or
  unexpected names and differing shapes are refused, each named (a base of another size, another
  embodiment count or another chunk_size, GR00T's ``action_horizon``);
- PPO's critic (``value_head.*``) has no place in GR00T: dropped and listed;
- the backbone tensors are the base's, bitwise; when the run also trained the backbone
  (``optim.freeze_vlm = false``) the export says how far the trained backbone was from the base's,
  because the exported policy then differs from the trained one (train with ``freeze_vlm`` for a
  faithful action-head export);
- every other file of the base (config, processor files, statistics, embodiment ids) is copied byte
  for byte; the weights file keeps the base's dtype per tensor and its safetensors metadata.

Two targets, by the base's layout:

- ``lerobot`` (default): the base is a LeRobot ``GrootPolicy`` folder (``_groot_model.`` names, its
  processors; default: an RL run's ``init``, an SFT run's ``final/``, whose processors carry the
  data's statistics under ``finetune.embodiment``, or the source folder itself). The result is what
  ``GrootPolicy.from_pretrained`` and ``cosmos-robot serve --ckpt`` load; like any LeRobot GR00T
  folder it names its raw base model in ``config.json`` (``base_model_path``), unchanged.
- ``gr00t``: the base is a raw GR00T N1.7 checkpoint (Isaac-GR00T's layout: ``config.json`` of
  ``GR00TN17``, ``processor_config.json``, ``statistics.json``, ``embodiment_id.json``; default: the
  ``base_model_path`` the LeRobot folder names). The result is a GR00T N1.7 model folder that
  Isaac-GR00T-style tools take, and that LeRobot takes as ``GrootConfig(base_model_path=...)``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import read_json
from cosmos_robot_exporters.base import (
    VALUE_HEAD,
    ExportError,
    ExportResult,
    begin_export,
    staged_export,
    written_files,
)
from cosmos_robot_exporters.sources import load_trained_weights

__all__ = ["Gr00tExporter"]

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
HEAD, BACKBONE = "action_head.", "backbone."


class Gr00tExporter:
    """Training run or GR00T policy folder -> a base GR00T checkpoint carrying the trained action head."""

    name = "groot"
    targets: tuple[str, ...] = ("lerobot", "gr00t")

    def export(self, source: Path, out: Path, *, target: str, base: Path | None, overwrite: bool) -> ExportResult:
        source, run, info = begin_export(self, source, target)
        out = Path(out)
        notes: list[str] = []
        if run is not None:
            if not run.is_rl:
                _check_sft_run(run, target, base)
            weights, notes = load_trained_weights(run, use_ema=False)
            policy_folder = run.template()
        else:
            _check_lerobot(source, "the source")
            weights = _load(source / WEIGHTS)
            policy_folder = source
            notes.append(f"action head of {source}")
        base = _default_base(base, target, policy_folder)
        (_check_lerobot if target == "lerobot" else _check_raw)(base, "--base")
        notes.append(f"base: {base} (everything but the action head kept as it is)")
        tensors, metadata, dropped, base_notes = _merge(base, weights, str(run.checkpoint if run else source))
        notes += base_notes
        info.update({"base": str(base), "dropped": dropped})
        with staged_export(out, overwrite, info, protect=(source, base)) as tmp:
            _copy_except_weights(base, tmp)
            from safetensors.torch import save_file

            save_file(tensors, str(tmp / WEIGHTS), metadata=metadata)
        return ExportResult(out, self.name, target, source, written_files(out), dropped, notes)


def _check_sft_run(run: Any, target: str, base: Path | None) -> None:
    """An SFT run's export keeps the processors its ``final/`` carries (the data's statistics under
    ``finetune.embodiment``); a raw base must already know that embodiment."""
    if run.final is None:
        raise ExportError(
            f"{run.run_dir}: this SFT run has no final/ yet; its processors (the data's statistics) are written "
            "there when the run finishes: resume it to the end, then export"
        )
    embodiment = (run.config.get("finetune") or {}).get("embodiment")
    if target == "gr00t" and embodiment:
        raw = base or _default_base(None, target, run.final)
        stats = read_json(raw / "statistics.json") if (raw / "statistics.json").is_file() else {}
        if embodiment not in stats:
            raise ExportError(
                f"{run.run_dir}: finetune.embodiment {embodiment!r} has no statistics in {raw / 'statistics.json'} "
                f"(it has {sorted(stats)}); export to the 'lerobot' target, whose processors carry the data's"
            )


def _load(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise ExportError(f"{path}: missing (a GR00T checkpoint folder holds {WEIGHTS})")
    return load_file(str(path))


def _is_policy_folder(folder: Path) -> bool:
    """The registry says ``folder`` is a GR00T policy folder (LeRobot's ``GrootPolicy`` layout)."""
    from cosmos_robot.policies.registry import CheckpointError, family_of

    try:
        return family_of(folder).name == Gr00tExporter.name and (folder / WEIGHTS).is_file()
    except CheckpointError:
        return False


def _check_lerobot(folder: Path, what: str) -> None:
    if not _is_policy_folder(folder):
        raise ExportError(
            f"{what} {folder} is not a LeRobot GR00T policy folder (config.json of a GrootPolicy and {WEIGHTS})"
        )


def _check_raw(folder: Path, what: str) -> None:
    config = folder / "config.json"
    data = read_json(config) if config.is_file() else {}
    if "GR00TN17" not in (data.get("architectures") or []) or not (folder / WEIGHTS).is_file():
        kind = (
            " (a LeRobot GrootPolicy folder: that is the 'lerobot' target's base)" if _is_policy_folder(folder) else ""
        )
        raise ExportError(
            f"{what} {folder} is not a raw GR00T N1.7 checkpoint{kind}: the 'gr00t' target takes a folder whose "
            f'config.json names architectures ["GR00TN17"] (Isaac-GR00T\'s layout, what base_model_path names)'
        )


def _default_base(base: Path | None, target: str, policy_folder: Path | None) -> Path:
    if base is not None:
        return base
    if policy_folder is None:
        raise ExportError("the run names no init folder; pass the base GR00T checkpoint with --base")
    if target == "lerobot":
        return policy_folder
    named = read_json(policy_folder / "config.json").get("base_model_path")
    if not isinstance(named, str) or not Path(named).expanduser().is_dir():
        raise ExportError(
            f"{policy_folder / 'config.json'}: base_model_path {named!r} is not a local folder; "
            "pass the raw GR00T N1.7 checkpoint with --base"
        )
    return Path(named).expanduser()


def _split(keys: list[str], part: str) -> dict[str, str]:
    """``relative name after part -> key`` for keys that hold ``part`` at a module boundary."""
    out = {}
    for key in keys:
        for i in range(len(key)):
            if key.startswith(part, i) and (i == 0 or key[i - 1] == "."):
                out[key[i + len(part) :]] = key
                break
    return out


def _merge(
    base: Path, weights: dict[str, Any], what: str
) -> tuple[dict[str, Any], dict[str, str], list[str], list[str]]:
    from safetensors import safe_open

    with safe_open(str(base / WEIGHTS), framework="pt") as fh:
        metadata = dict(fh.metadata() or {})
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    base_head = _split(list(tensors), HEAD)
    base_backbone = _split([k for k in tensors if k not in set(base_head.values())], BACKBONE)
    if not base_head:
        raise ExportError(f"{base / WEIGHTS}: no action_head.* tensors: not a GR00T N1.7 checkpoint")
    dropped = sorted(k for k in weights if k.startswith(VALUE_HEAD))
    head = _split([k for k in weights if k not in dropped], HEAD)
    backbone = _split([k for k in weights if k not in set(head.values())], BACKBONE)
    other = sorted(set(weights) - set(head.values()) - set(backbone.values()) - set(dropped))
    problems = []
    missing, unexpected = sorted(set(base_head) - set(head)), sorted(set(head) - set(base_head))
    if missing:
        problems.append("missing keys (in the base, not trained): " + _names(HEAD, missing))
    if unexpected:
        problems.append("unexpected keys (trained, not in the base): " + _names(HEAD, unexpected))
    if other:
        problems.append("unexpected keys (neither backbone, action head nor value head): " + ", ".join(other[:6]))
    for rel in sorted(set(base_head) & set(head)):
        a, b = tuple(weights[head[rel]].shape), tuple(tensors[base_head[rel]].shape)
        if a != b:
            problems.append(f"shape of {HEAD}{rel}: {a} trained vs {b} in the base")
    if problems:
        raise ExportError(
            f"{base / WEIGHTS}: this base does not match the trained action head of {what}:\n  "
            + "\n  ".join(problems[:12])
            + "\npass the base the run started from with --base"
        )
    notes = []
    cast = 0
    for rel, key in base_head.items():
        value = weights[head[rel]].detach().to("cpu")
        if value.dtype != tensors[key].dtype:
            cast += 1
        tensors[key] = value.to(tensors[key].dtype).contiguous()
    if cast:
        notes.append(f"{cast} action-head tensors cast to the base's dtype")
    notes.append(f"{len(base_head)} action-head tensors replaced, {len(tensors) - len(base_head)} kept from the base")
    if dropped:
        notes.append(f"PPO's value head ({len(dropped)} tensors) is not part of GR00T: dropped")
    drift = [
        float((weights[backbone[rel]].float() - tensors[key].float()).abs().max())
        for rel, key in base_backbone.items()
        if rel in backbone and tuple(weights[backbone[rel]].shape) == tuple(tensors[key].shape)
    ]
    moved = [d for d in drift if d > 0]
    if moved:
        note = (
            f"the trained backbone differs from the base's in {len(moved)} of {len(drift)} tensors (max |diff| "
            f"{max(moved):.3g}); this action-head export keeps the base's backbone, so it is not exactly the trained "
            "policy (train with optim.freeze_vlm = true for a faithful action-head export)"
        )
        log.warning(note)
        notes.append(note)
    return tensors, metadata, dropped, notes


def _names(part: str, rels: list[str], n: int = 6) -> str:
    names = [part + r if not r.startswith(part) else r for r in rels]
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _copy_except_weights(base: Path, tmp: Path) -> None:
    """Every file of the base but the weights and a previous manifest, byte for byte."""
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base)
        if rel.as_posix() in (WEIGHTS, "manifest.json") or not path.is_file():
            continue
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, tmp / rel)
