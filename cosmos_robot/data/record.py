"""``cosmos-robot record``: scripted-expert demonstrations written as a LeRobot v3 dataset.

Why LeRobot's own writer (``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``)
rather than our own parquet: the result is a dataset every LeRobot tool reads (``LeRobotDataset(repo_id,
root=DIR)``, the visualiser, ``push_to_hub``), and our loader reads it back through the same API.

How a run goes: N multi-task envs (``obs_mode="all"``: both cameras plus the privileged
``object_state`` the experts act from) step in lockstep through the vector layer; finished episodes
come back in schedule order (see ``rollouts.py``) and are written one at a time, because LeRobot's
writer holds one open episode. With ``only_success`` (the default) failed expert episodes are counted
and left out. Images are stored as PNG inside the parquet files (``dtype="image"``, no ffmpeg
needed); ``use_videos`` stores MP4s through LeRobot's streaming encoder instead.

Beside LeRobot's files the run writes ``meta/cosmos_robot.json``: the command, the config, the seed
rule, every dataset episode's (task, index, seed, length) and every dropped episode with its reason.
LeRobot ignores the file; ``load_sidecar`` reads it.
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosmos_robot.data.background import BackgroundWriter
from cosmos_robot.data.rollouts import Episode, build_schedule, run_rollouts
from cosmos_robot.data.schema import (
    ACTION,
    CAMERAS,
    FPS,
    OBJECT_STATE,
    ROBOT_TYPE,
    SIDECAR,
    STATE,
    camera_key,
    demo_features,
)
from cosmos_robot_envs.eval.config import check_rollout_fields

__all__ = ["RecordCallbacks", "RecordConfig", "load_sidecar", "prepare_out_dir", "record_demonstrations"]

SEED_RULE = "first 4 bytes (big-endian) of sha256(f'demo/{seed}/{task}/{index}'), masked to 31 bits"


@dataclass(frozen=True)
class RecordConfig:
    """One recording run; saved in ``meta/cosmos_robot.json``."""

    tasks: tuple[str, ...] = ()  # task names of the suite; empty = all of them
    episodes_per_task: int = 50  # rollouts attempted per task (failures are dropped with only_success)
    suite: str = "tabletop"  # env suite
    num_envs: int = 4  # envs stepped in lockstep
    image_size: int = 128  # camera images are image_size x image_size pixels
    seed: int = 0  # base seed; episode seeds derive from it (SEED_RULE)
    only_success: bool = True  # keep only episodes the expert solved
    vector_mode: str = "async"  # "sync" (in-process) or "async" (one worker process per env)
    use_videos: bool = False  # store cameras as MP4 (LeRobot's encoder) instead of PNG frames
    max_steps: int | None = None  # override every task's episode length (control steps)
    repo_id: str = "local/cosmos_robot_tabletop"  # LeRobot's dataset id (only a name when stored locally)
    image_writer_threads: int = 4  # LeRobot's threaded PNG writer (0: write in the calling thread)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        check_rollout_fields(self, ("episodes_per_task", "num_envs", "image_size"))
        if self.image_writer_threads < 0:
            raise ValueError(f"image_writer_threads: expected >= 0, got {self.image_writer_threads}")
        if "/" not in self.repo_id:
            raise ValueError(f"repo_id: expected 'owner/name' (LeRobot's form), got {self.repo_id!r}")


class RecordCallbacks:
    """Progress hooks; the defaults do nothing (the CLI passes a rich progress bar)."""

    def start(self, total: int) -> None:
        """Called once with the number of episodes that will be rolled out."""

    def episode(self, episode: Episode, kept: bool) -> None:
        """Called after each episode is written (``kept``) or dropped."""


def prepare_out_dir(out: Path, overwrite: bool) -> None:
    """Make ``out`` free for ``LeRobotDataset.create`` (which insists on creating the folder itself)."""
    if not out.exists():
        return
    if out.is_file():
        raise FileExistsError(f"--out {out} is a file; pass a folder path")
    if not any(out.iterdir()):
        out.rmdir()
        return
    if not overwrite:
        raise FileExistsError(f"--out {out} already exists; pass --overwrite to replace it, or choose another folder")
    if not (out / "meta" / "info.json").exists():
        raise FileExistsError(
            f"--out {out} is a non-empty folder that is not a LeRobot dataset (no meta/info.json); "
            "refusing to delete it even with --overwrite"
        )
    shutil.rmtree(out)


def load_sidecar(root: str | Path) -> dict[str, Any]:
    """``meta/cosmos_robot.json`` of a recorded dataset (seeds, command, dropped episodes)."""
    path = Path(root) / SIDECAR
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found; was {root} written by `cosmos-robot record`?")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _frame(ep: Episode, t: int, cameras: Sequence[str]) -> dict[str, Any]:
    frame: dict[str, Any] = {camera_key(cam): ep.images[cam][t] for cam in cameras}
    frame[STATE] = ep.states[t]
    frame[OBJECT_STATE] = ep.object_states[t]
    frame[ACTION] = ep.actions[t]
    frame["task"] = ep.prompt
    return frame


def _episode_row(ep: Episode) -> dict[str, Any]:
    row: dict[str, Any] = {"task": ep.spec.task, "index": ep.spec.index, "seed": ep.spec.seed, "length": ep.frames}
    row["success"] = ep.success
    if ep.reason is not None:
        row["reason"] = ep.reason
    if ep.error:
        row["error"] = ep.error
    return row


class _Sink:
    """Writes kept episodes into the LeRobot dataset (on the writer thread) and keeps the tally."""

    def __init__(self, dataset: Any, config: RecordConfig, callbacks: RecordCallbacks) -> None:
        self.dataset, self.config, self.callbacks = dataset, config, callbacks
        self.kept: list[dict[str, Any]] = []
        self.dropped: list[dict[str, Any]] = []
        self.frames = 0

    def write(self, ep: Episode) -> None:
        keep = ep.frames > 0 and (ep.success or not self.config.only_success)
        if keep:
            for t in range(ep.frames):
                self.dataset.add_frame(_frame(ep, t, CAMERAS))
            self.dataset.save_episode()
            self.kept.append({"episode_index": len(self.kept), **_episode_row(ep)})  # LeRobot's episode_index
            self.frames += ep.frames
        else:
            self.dropped.append(_episode_row(ep))
        self.callbacks.episode(ep, keep)

    def counts(self, scheduled: int, tasks: Sequence[str]) -> dict[str, Any]:
        rows = [*self.kept, *self.dropped]
        per_task = {t: {"kept": 0, "failed": 0} for t in tasks}
        for row in self.kept:
            per_task[row["task"]]["kept"] += 1
        for row in rows:
            per_task[row["task"]]["failed"] += int(not row["success"])
        return {
            "scheduled": scheduled,
            "rolled_out": len(rows),
            "kept": len(self.kept),
            "dropped": len(self.dropped),
            "failed": sum(not r["success"] for r in rows),
            "frames": self.frames,
            "per_task": per_task,
        }


def record_demonstrations(
    config: RecordConfig,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    callbacks: RecordCallbacks | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Roll out the scripted experts and write a LeRobot dataset at ``out_dir``; return the sidecar dict.

    ``callbacks.episode`` runs on the writer thread. ``command`` is recorded in the sidecar (default
    ``sys.argv``). Raises ``FileExistsError`` when ``out_dir`` is taken (see ``prepare_out_dir``),
    ``ValueError`` for an unknown suite or task, ``RuntimeError`` when no episode was kept.
    """
    import datasets
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from cosmos_robot_envs.eval import get_suite
    from cosmos_robot_envs.vector import make_vector_env

    out = Path(out_dir)
    if config.suite != "tabletop":
        raise ValueError(
            f"suite {config.suite!r}: `record` rolls out the scripted experts, which exist for the tabletop suite "
            "only; LIBERO's demonstrations are published as LeRobot datasets (e.g. the lerobot/libero_* ones)"
        )
    suite = get_suite(config.suite)
    config = RecordConfig(**{**asdict(config), "tasks": suite.resolve_tasks(config.tasks)})
    prepare_out_dir(out, overwrite)
    schedule = build_schedule(config.tasks, config.episodes_per_task, config.seed)

    bars_were_on = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()  # one "Map" bar per saved episode otherwise
    dataset = LeRobotDataset.create(
        config.repo_id,
        fps=FPS,
        features=demo_features(config.image_size, config.use_videos),
        root=out,
        robot_type=ROBOT_TYPE,
        use_videos=config.use_videos,
        image_writer_threads=0 if config.use_videos else config.image_writer_threads,
        streaming_encoding=config.use_videos,  # encode while recording: no PNG staging, no ffmpeg subprocess
    )
    sink = _Sink(dataset, config, callbacks or RecordCallbacks())
    status = "interrupted"
    t0 = time.perf_counter()
    sink.callbacks.start(len(schedule))
    try:
        venv = make_vector_env(
            suite.make_env(config.tasks, config.image_size, config.max_steps),
            num_envs=min(config.num_envs, len(schedule)),
            mode=config.vector_mode,  # type: ignore[arg-type]
        )
        try:
            with BackgroundWriter(sink.write, max_pending=2 * venv.num_envs) as writer:
                for ep in run_rollouts(venv, schedule, CAMERAS):
                    writer.put(ep)
        finally:
            venv.close()
        status = "complete"
    finally:
        dataset.finalize()
        _remove_empty_staging(out)
        if bars_were_on:
            datasets.utils.logging.enable_progress_bar()
        sidecar = _sidecar(config, sink, len(schedule), status, time.perf_counter() - t0, command)
        if out.exists():
            (out / SIDECAR).write_text(json.dumps(sidecar, indent=1) + "\n")
    if not sink.kept:
        reasons = sorted({str(r.get("reason")) for r in sink.dropped})
        raise RuntimeError(
            f"no episode was kept: all {len(sink.dropped)} expert rollouts failed (reasons: {reasons}); "
            f"see {out / SIDECAR}"
        )
    return sidecar


def _sidecar(
    config: RecordConfig, sink: _Sink, scheduled: int, status: str, wall_s: float, command: Sequence[str] | None
) -> dict[str, Any]:
    counts = sink.counts(scheduled, config.tasks)
    return {
        "format": "cosmos_robot.demonstrations/v1",
        "status": status,  # "complete" or "interrupted" (the episodes written so far form a valid dataset)
        "command": list(command) if command is not None else list(sys.argv),
        "config": {**asdict(config), "tasks": list(config.tasks)},
        "seed_rule": SEED_RULE,
        "counts": counts,
        "throughput": {
            "wall_s": round(wall_s, 3),
            "episodes_per_min": round(60 * counts["rolled_out"] / wall_s, 2) if wall_s > 0 else 0.0,
            "frames_per_s": round(sink.frames / wall_s, 2) if wall_s > 0 else 0.0,
        },
        "privileged_features": {
            OBJECT_STATE: "simulator state (object pose, goal, drawer opening, task one-hot) the experts act "
            "from; for RL critics and analysis, not a deployable policy input"
        },
        "episodes": sink.kept,  # dataset episode_index -> task, index within the task, reset seed, length
        "dropped_episodes": sink.dropped,
        "versions": _versions(),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _remove_empty_staging(out: Path) -> None:
    """LeRobot stages PNGs under ``images/`` and leaves the emptied folders behind; drop them."""
    staging = out / "images"
    if staging.is_dir() and not any(p.is_file() for p in staging.rglob("*")):
        shutil.rmtree(staging)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0]}
    for dist in ("cosmos-robot", "cosmos-robot-envs", "lerobot", "mujoco"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found
