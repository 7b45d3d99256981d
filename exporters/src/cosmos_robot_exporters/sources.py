"""What ``cosmos-robot export SOURCE`` can be: a policy folder, a training run, or one of its checkpoints.

- a policy folder: anything ``serve --ckpt`` takes (a run's ``final/``, a LeRobot download, ...);
- a run folder ``runs/NAME`` (``config.resolved.json`` + ``checkpoints/step_*/``): its newest
  complete checkpoint; ``runs/NAME/checkpoints/step_000200``: that one.

A training checkpoint holds only the model's ``state_dict`` (``model.safetensors``; for RL the RL
model, PPO's critic under ``value_head.`` included) and the trainer's state (``trainer_state.pt``:
optimizer, EMA, RNG). Everything else an export needs comes from the run's recipe
(``config.resolved.json``): ``init``, the policy folder the run started from (its config,
processors, tokenizer and, for RL, its normalisation stats), ``trainer`` and, for SFT, the data
whose stats the exported policy must carry (the run's ``final/`` has them once written; before
that they are recomputed from ``data.root`` as the trainer computes them).

The layout constants are those of ``cosmos_robot_trainers.common.checkpoint`` / ``rundir``, repeated
here because exporters sit below trainers in the dependency graph (ARCHITECTURE.md); the tests write
run folders with the trainers' own ``save_checkpoint`` so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos_robot.manifest import verify_manifest
from cosmos_robot.policies.registry import CheckpointError, read_json

__all__ = ["RunSource", "family_for", "load_trained_weights", "resolve_run", "sft_data_stats"]

RUN_CONFIG = "config.resolved.json"
CHECKPOINTS = "checkpoints"
MODEL_FILE, STATE_FILE = "model.safetensors", "trainer_state.pt"
SHARDED_DIR = "sharded"  # a sharded checkpoint's torch.distributed.checkpoint folder (train.checkpoint_format)
FINAL = "final"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


@dataclass
class RunSource:
    """A training run resolved to one checkpoint and the folders an export builds on."""

    run_dir: Path
    checkpoint: Path  # the step folder whose weights are exported
    step: int
    config: dict[str, Any]  # config.resolved.json
    init: Path | None  # the policy folder the run started from (None: an SFT run of a new flow model)
    final: Path | None  # the run's final/ (a policy folder) when it was written
    notes: list[str] = field(default_factory=list)

    @property
    def trainer(self) -> str:
        return str(self.config.get("trainer", "sft"))

    @property
    def is_rl(self) -> bool:
        return self.trainer != "sft"

    def template(self) -> Path | None:
        """The policy folder whose config, processors and stats the export keeps.

        RL: ``init`` (RL never changes normalisation). SFT: ``final/`` once written (it carries the
        data's stats), else ``init`` (its stats are then replaced with recomputed ones)."""
        folder = self.final if not self.is_rl and self.final is not None else self.init
        if folder is not None:
            verify_manifest(folder)  # the export copies its files: they must be the ones that were written
        return folder

    def describe(self) -> str:
        return f"{self.trainer} run {self.run_dir} at step {self.step} ({self.checkpoint.name})"


def _complete(step_dir: Path) -> bool:
    weights = (step_dir / MODEL_FILE).is_file() or (step_dir / SHARDED_DIR / ".metadata").is_file()
    return weights and (step_dir / STATE_FILE).is_file()


def _is_run(path: Path) -> bool:
    return (path / RUN_CONFIG).is_file() and (path / CHECKPOINTS).is_dir()


def resolve_run(source: Path) -> RunSource | None:
    """``source`` as a training run (None when it is not a run or one of its checkpoints)."""
    source = Path(source)
    match = _STEP_DIR.match(source.name)
    if match and source.parent.name == CHECKPOINTS and (source.parent.parent / RUN_CONFIG).is_file():
        run_dir, step_dir = source.parent.parent, source
        if not _complete(step_dir):
            raise CheckpointError(f"{step_dir}: incomplete checkpoint (needs {MODEL_FILE} and {STATE_FILE})")
    elif _is_run(source):
        run_dir = source
        steps = sorted(
            (int(m.group(1)), p)
            for p in (source / CHECKPOINTS).iterdir()
            if (m := _STEP_DIR.match(p.name)) and p.is_dir() and _complete(p)
        )
        if not steps:
            hint = f"; its policy folder is {source / FINAL}" if (source / FINAL).is_dir() else ""
            raise CheckpointError(f"{source}: a training run without a complete checkpoint in {CHECKPOINTS}/{hint}")
        step_dir = steps[-1][1]
    else:
        return None
    config = read_json(run_dir / RUN_CONFIG)
    step = int(_STEP_DIR.match(step_dir.name).group(1))  # type: ignore[union-attr]
    final: Path | None = run_dir / FINAL if (run_dir / FINAL / "config.json").is_file() else None
    init_value = config.get("init")
    init = _resolve_init(str(init_value), run_dir) if init_value else None
    return RunSource(run_dir, step_dir, step, config, init, final)


def _resolve_init(init: str, run_dir: Path) -> Path:
    """The run's ``init`` as a folder: as given (absolute or from the working directory), else relative
    to the run folder's parents (recipes name ``checkpoints/...`` from the repository root), or a
    ``tiny:<family>`` debug checkpoint (the core's ``resolve_init`` builds it when it is missing)."""
    if init.startswith("tiny:"):
        from cosmos_robot.policies.init_source import resolve_init

        return Path(resolve_init(init, field=f"{run_dir / RUN_CONFIG}: init"))
    path = Path(init)
    if path.is_dir():
        return path
    if not path.is_absolute():
        for parent in run_dir.resolve().parents:
            if (parent / path).is_dir():
                return parent / path
    raise CheckpointError(
        f"{run_dir / RUN_CONFIG}: init {init!r} (the policy folder this run started from) does not exist here; "
        "pass it with --base, or run the export from the folder the training ran in"
    )


def family_for(source: Path) -> Any:
    """The registry ``Family`` of ``source``: its own, or for a run that of the policy it trains (its
    final/ or init; an SFT run of a new model: the ``type`` of its recipe's ``[model]`` table)."""
    from cosmos_robot.policies.registry import FAMILIES, family_of

    run = resolve_run(source)
    if run is None:
        return family_of(source)
    folder = run.final or run.init
    if folder is not None:
        return family_of(folder)
    kind = (run.config.get("model") or {}).get("type")
    for family in FAMILIES.values():
        if kind in family.config_types:
            return family
    raise CheckpointError(
        f"{run.run_dir / RUN_CONFIG}: neither init nor a [model] table with a known 'type' ({kind!r})"
    )


def load_trained_weights(run: RunSource, use_ema: bool = True) -> tuple[dict[str, Any], list[str]]:
    """The checkpoint's model tensors (the EMA weights when the run kept an EMA) and notes saying which."""
    import torch
    from safetensors.torch import load_file

    if (run.checkpoint / MODEL_FILE).is_file():
        weights = load_file(str(run.checkpoint / MODEL_FILE))
        notes = [f"weights of {run.describe()}"]
    else:
        weights = consolidate_sharded(run.checkpoint / SHARDED_DIR)
        notes = [f"weights of {run.describe()}, consolidated from its shards"]
    if use_ema:
        state = torch.load(run.checkpoint / STATE_FILE, map_location="cpu", weights_only=True)
        ema = state.get("ema") if isinstance(state, dict) else None
        if isinstance(ema, dict) and isinstance(ema.get("shadow"), dict):
            shadow = ema["shadow"]
            unknown = sorted(set(shadow) - set(weights))
            if unknown:
                raise CheckpointError(f"{run.checkpoint / STATE_FILE}: EMA tensors not in the model: {unknown[:4]}")
            weights.update({k: v.detach().to("cpu").contiguous() for k, v in shadow.items()})
            notes.append(f"EMA weights (decay {ema.get('decay')}, {ema.get('updates')} updates), as final/ exports")
    return weights, notes


def consolidate_sharded(folder: Path) -> dict[str, Any]:
    """The whole model tensors of a sharded checkpoint (every rank's shards of ``model.*``, joined), read in
    one process without a process group; the optimizer state in the same files is left unread."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    model = {
        key[len("model.") :]: torch.empty(m.size, dtype=m.properties.dtype)
        for key, m in meta.items()
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    if not model:
        raise CheckpointError(f"{folder}: a sharded checkpoint without model tensors")
    with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent here
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
        dcp.load({"model": model}, checkpoint_id=str(folder), planner=planner)
    return model


def sft_data_stats(run: RunSource) -> dict[str, Any]:
    """The stats an SFT run's ``final/`` carries, recomputed from its data (``{"state", "actions"}``).

    The same computation as the SFT trainer's (``compute_norm_stats`` over every frame of
    ``data.root``, the first ``data.max_episodes_per_task`` episodes of each task), checked against
    the sample count the checkpoint recorded for its data."""
    import numpy as np
    import torch

    from cosmos_robot.data.loader import compute_norm_stats, load_demonstrations
    from cosmos_robot.data.schema import ACTION, STATE

    data = run.config.get("data") or {}
    root = Path(str(data.get("root", "")))
    if not (root / "meta" / "info.json").is_file() and not root.is_absolute():
        for parent in run.run_dir.resolve().parents:
            if (parent / root / "meta" / "info.json").is_file():
                root = parent / root
                break
    info = json.loads((root / "meta" / "info.json").read_text()) if (root / "meta" / "info.json").is_file() else None
    if info is None:
        raise CheckpointError(
            f"{run.run_dir}: an SFT run without final/; its export needs the stats of its data {data.get('root')!r}, "
            "which is not here (export from the folder the training ran in, or export final/ once written)"
        )
    features = info.get("features", {})
    cameras = [k.removeprefix("observation.images.") for k in features if k.startswith("observation.images.")]
    if not cameras:
        raise CheckpointError(f"{root}/meta/info.json: no observation.images.* feature; not a recorded demo dataset")
    camera = cameras[0]
    demo = load_demonstrations(root, chunk_size=1, image_size=1, cameras=(camera,))
    limit = data.get("max_episodes_per_task")
    if limit is not None:
        episodes = demo.episode_index.numpy()
        first = {int(ep): i for i, ep in reversed(list(enumerate(episodes.tolist())))}
        per_task: dict[str, list[int]] = {}
        for ep in sorted(first):
            per_task.setdefault(demo.prompts[first[ep]], []).append(ep)
        chosen = sorted(ep for eps in per_task.values() for ep in eps[: int(limit)])
        keep = torch.from_numpy(np.flatnonzero(np.isin(episodes, chosen)))
        demo.state, demo.actions = demo.state[keep], demo.actions[keep]
    state = torch.load(run.checkpoint / STATE_FILE, map_location="cpu", weights_only=True)
    recorded = (state.get("data") or {}).get("samples") if isinstance(state, dict) else None
    if recorded is not None and int(recorded) != int(demo.state.shape[0]):
        raise CheckpointError(
            f"{root}: {demo.state.shape[0]} frames now, but {run.checkpoint} was trained on {recorded}: "
            "the data changed since training; export the run's final/ instead"
        )
    raw = compute_norm_stats(demo)
    return {"state": raw[STATE], "actions": raw[ACTION]}
