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

Why a rerun resumes: training starts recordings by itself, and one stopped by Ctrl-C (status
``interrupted``: LeRobot's ``finalize`` ran) is a valid but short dataset that would otherwise be
trained on as if whole. Rerunning with the same config reopens it with ``LeRobotDataset.resume`` and
rolls out exactly the scheduled episodes it lacks (the written ones are a prefix of the schedule, so
the result equals an uninterrupted run's). The sidecar says ``recording`` while a run is under way;
a folder left in that state by a killed run is refused with the fix (LeRobot's buffered metadata is
lost), and so is a folder with another config; ``--overwrite`` starts over. A complete dataset with
the same config is left alone.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosmos_robot.data.background import BackgroundWriter
from cosmos_robot.data.local import IncompleteDatasetError, check_local_dataset, killed_message, read_sidecar
from cosmos_robot.data.rollouts import Episode, EpisodeSpec, build_schedule, run_rollouts
from cosmos_robot.data.schema import ACTION, DEMO_LAYOUTS, SIDECAR, DemoLayout, camera_key, demo_layout
from cosmos_robot_envs.eval.config import check_rollout_fields

__all__ = [
    "IncompleteDatasetError",
    "RecordCallbacks",
    "RecordConfig",
    "load_sidecar",
    "prepare_out_dir",
    "record_demonstrations",
]

# fields that change how fast a recording goes, not what it records: a resumed run may change them
RUNTIME_FIELDS = frozenset({"num_envs", "vector_mode", "image_writer_threads"})
SEED_RULE = "first 4 bytes (big-endian) of sha256(f'demo/{seed}/{task}/{index}'), masked to 31 bits"


@dataclass(frozen=True)
class RecordConfig:
    """One recording run; saved in ``meta/cosmos_robot.json``."""

    tasks: tuple[str, ...] = ()  # task names of the suite; empty = all of them
    episodes_per_task: int = 50  # rollouts attempted per task (failures are dropped with only_success)
    suite: str = "tabletop"  # env suite with scripted experts (schema.DEMO_LAYOUTS): tabletop, driving
    cameras: bool = True  # record the suite's cameras (False: vectors only, nothing rendered)
    expert_noise: float = 0.0  # DART-style: perturb the executed actions by this scale, store clean labels
    noise_tasks: tuple[str, ...] = ()  # the tasks whose episodes expert_noise perturbs (empty: every task)
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
        object.__setattr__(self, "noise_tasks", tuple(self.noise_tasks))
        check_rollout_fields(self, ("episodes_per_task", "num_envs", "image_size"))
        if self.image_writer_threads < 0:
            raise ValueError(f"image_writer_threads: expected >= 0, got {self.image_writer_threads}")
        if self.expert_noise < 0:
            raise ValueError(f"expert_noise: expected >= 0, got {self.expert_noise}")
        if self.noise_tasks and self.expert_noise == 0:
            raise ValueError(f"noise_tasks: {list(self.noise_tasks)} given but expert_noise is 0 (nothing to perturb)")
        if "/" not in self.repo_id:
            raise ValueError(f"repo_id: expected 'owner/name' (LeRobot's form), got {self.repo_id!r}")


class RecordCallbacks:
    """Progress hooks; the defaults do nothing (the CLI passes a rich progress bar)."""

    def start(self, total: int) -> None:
        """Called once with the number of episodes that will be rolled out (those a resumed run lacks)."""

    def episode(self, episode: Episode, kept: bool) -> None:
        """Called after each episode is written (``kept``) or dropped."""


def prepare_out_dir(out: Path, overwrite: bool, config: RecordConfig | None = None) -> dict[str, Any] | None:
    """Make ``out`` ready for a recording of ``config``; return the sidecar of the recording to resume.

    None: ``out`` is free for ``LeRobotDataset.create`` (which insists on creating the folder itself).
    A sidecar: ``out`` holds an ``interrupted`` (resume it) or ``complete`` (nothing to do) recording of
    the same ``config``. Raises ``FileExistsError`` (the message says what to do) for a taken folder:
    another config, a killed recording, a dataset not written by this recorder; with ``config`` None,
    for any dataset.
    """
    if not out.exists():
        return None
    if out.is_file():
        raise FileExistsError(f"--out {out} is a file; pass a folder path")
    if not any(out.iterdir()):
        out.rmdir()
        return None
    if not (out / "meta" / "info.json").exists():
        raise FileExistsError(
            f"--out {out} is a non-empty folder that is not a LeRobot dataset (no meta/info.json); "
            "refusing to write into it or delete it (even with --overwrite): choose another folder"
        )
    if overwrite:
        shutil.rmtree(out)
        return None
    side = read_sidecar(out)
    if config is None or side is None:
        what = (
            "a dataset" if side is not None else f"a LeRobot dataset without {SIDECAR} (not recorded here, or killed)"
        )
        raise FileExistsError(
            f"--out {out} already exists and holds {what}; pass --overwrite to replace it, or choose another folder"
        )
    if side.get("status") == "recording":
        raise IncompleteDatasetError(killed_message(out))
    diffs = _config_diffs(side.get("config", {}), config)
    if diffs:
        raise FileExistsError(
            f"--out {out} holds a recording with another config ({'; '.join(diffs)}); pass --overwrite to replace "
            "it, or choose another folder"
        )
    if side.get("status") == "interrupted":
        info = check_local_dataset(out)
        if int(info.get("total_episodes", -1)) != len(side.get("episodes", [])):
            raise IncompleteDatasetError(
                f"{out}: its LeRobot files hold {info.get('total_episodes')} episodes but {SIDECAR} lists "
                f"{len(side.get('episodes', []))}, so it cannot be resumed; delete it, or pass --overwrite"
            )
    return side


def _config_diffs(saved: dict[str, Any], config: RecordConfig) -> list[str]:
    """``name: saved X, now Y`` for each field but ``RUNTIME_FIELDS`` that differs (a field the saved
    config predates counts as its default: recordings made before it existed recorded that)."""
    now = {**asdict(config), "tasks": list(config.tasks), "noise_tasks": list(config.noise_tasks)}
    default = {**asdict(RecordConfig()), "noise_tasks": []}
    return [
        f"{name}: saved {saved.get(name, default[name])!r}, now {now[name]!r}"
        for name in now
        if name not in RUNTIME_FIELDS and saved.get(name, default[name]) != now[name]
    ]


def load_sidecar(root: str | Path) -> dict[str, Any]:
    """``meta/cosmos_robot.json`` of a recorded dataset (seeds, command, dropped episodes)."""
    path = Path(root) / SIDECAR
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found; was {root} written by `cosmos-robot record`?")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _frame(ep: Episode, t: int, cameras: Sequence[str]) -> dict[str, Any]:
    frame: dict[str, Any] = {camera_key(cam): ep.images[cam][t] for cam in cameras}
    for key, seq in ep.vectors.items():
        frame[f"observation.{key}"] = seq[t]
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
    """Writes kept episodes into the LeRobot dataset (on the writer thread) and keeps the tally.

    ``previous``: the sidecar of the recording being resumed (its episodes come first in the tally).
    """

    def __init__(
        self, dataset: Any, config: RecordConfig, callbacks: RecordCallbacks, previous: dict[str, Any] | None
    ) -> None:
        self.dataset, self.config, self.callbacks = dataset, config, callbacks
        self.cameras = _cameras(config)
        self.kept: list[dict[str, Any]] = list(previous["episodes"]) if previous else []
        self.dropped: list[dict[str, Any]] = list(previous["dropped_episodes"]) if previous else []
        self.resumed = len(self.kept) + len(self.dropped)
        self.frames = self.resumed_frames = sum(int(r["length"]) for r in self.kept)

    def write(self, ep: Episode) -> None:
        keep = ep.frames > 0 and (ep.success or not self.config.only_success)
        if keep:
            for t in range(ep.frames):
                self.dataset.add_frame(_frame(ep, t, self.cameras))
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
            "resumed": self.resumed,  # episodes an interrupted run had rolled out before this one resumed it
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

    An interrupted recording of the same config in ``out_dir`` is resumed; a complete one is returned
    as it is. ``callbacks.episode`` runs on the writer thread. ``command`` is recorded in the sidecar
    (default ``sys.argv``). Raises ``FileExistsError`` when ``out_dir`` is taken (see
    ``prepare_out_dir``; ``IncompleteDatasetError`` for a killed recording), ``ValueError`` for an
    unknown suite or task, ``RuntimeError`` when no episode was kept.
    """
    import datasets

    from cosmos_robot_envs.eval import get_suite

    out = Path(out_dir)
    layout = demo_layout(config.suite)
    if config.expert_noise > 0 and layout.perturb_factory is None:
        raise ValueError(
            f"expert_noise: suite {config.suite!r} has no action perturbation for its experts; "
            f"suites with one: {sorted(n for n, lay in DEMO_LAYOUTS.items() if lay.perturb_factory)}"
        )
    suite = get_suite(config.suite)
    config = RecordConfig(**{**asdict(config), "tasks": suite.resolve_tasks(config.tasks)})
    stray = [t for t in config.noise_tasks if t not in config.tasks]
    if stray:
        raise ValueError(f"noise_tasks: {stray} are not among the recorded tasks {list(config.tasks)}")
    previous = prepare_out_dir(out, overwrite, config)
    if previous is not None and previous.get("status") == "complete":
        return previous
    schedule = build_schedule(config.tasks, config.episodes_per_task, config.seed)
    done = (
        {(r["task"], r["index"]) for r in [*previous["episodes"], *previous["dropped_episodes"]]} if previous else set()
    )
    todo = [spec for spec in schedule if (spec.task, spec.index) not in done]

    bars_were_on = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()  # one "Map" bar per saved episode otherwise
    dataset = _open_dataset(config, out, resume=previous is not None)
    sink = _Sink(dataset, config, callbacks or RecordCallbacks(), previous)
    status = "interrupted"
    t0 = time.perf_counter()
    try:
        _write_sidecar(out, _sidecar(config, sink, len(schedule), "recording", 0.0, command))  # until it ends
        sink.callbacks.start(len(todo))
        if todo:
            _roll_out(config, layout, todo, sink)
        status = "complete"
    finally:
        with _sigint_deferred():  # a Ctrl-C now would leave LeRobot's files half closed
            dataset.finalize()
            _remove_empty_staging(out)
            if bars_were_on:
                datasets.utils.logging.enable_progress_bar()
            sidecar = _sidecar(config, sink, len(schedule), status, time.perf_counter() - t0, command)
            if out.exists():
                _write_sidecar(out, sidecar)
    if not sink.kept:
        reasons = sorted({str(r.get("reason")) for r in sink.dropped})
        raise RuntimeError(
            f"no episode was kept: all {len(sink.dropped)} expert rollouts failed (reasons: {reasons}); "
            f"see {out / SIDECAR}"
        )
    return sidecar


def _open_dataset(config: RecordConfig, out: Path, *, resume: bool) -> Any:
    """A LeRobot dataset in write mode: created, or an interrupted one reopened (from disk only)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    layout = demo_layout(config.suite)
    threads = 0 if config.use_videos or not config.cameras else config.image_writer_threads
    if resume:  # prepare_out_dir checked every file: LeRobot has no reason to look at the hub
        return LeRobotDataset.resume(
            config.repo_id, root=out, image_writer_threads=threads, streaming_encoding=config.use_videos
        )
    return LeRobotDataset.create(
        config.repo_id,
        fps=layout.fps,
        features=layout.features(config.image_size, config.use_videos, config.cameras),
        root=out,
        robot_type=layout.robot_type,
        use_videos=config.use_videos,
        image_writer_threads=threads,
        streaming_encoding=config.use_videos,  # encode while recording: no PNG staging, no ffmpeg subprocess
    )


def _cameras(config: RecordConfig) -> tuple[str, ...]:
    return demo_layout(config.suite).cameras if config.cameras else ()


def _roll_out(config: RecordConfig, layout: DemoLayout, todo: Sequence[EpisodeSpec], sink: _Sink) -> None:
    """Roll out ``todo`` on the layout's envs, writing each finished episode on the writer thread."""
    from cosmos_robot_envs.vector import make_vector_env

    venv = make_vector_env(
        layout.make_env(config.tasks, config.image_size, config.max_steps, config.cameras),
        num_envs=min(config.num_envs, len(todo)),
        mode=config.vector_mode,  # type: ignore[arg-type]
    )
    try:
        with BackgroundWriter(sink.write, max_pending=2 * venv.num_envs) as writer:
            for ep in run_rollouts(venv, todo, _cameras(config), layout, config.expert_noise, config.noise_tasks):
                writer.put(ep)
    finally:
        venv.close()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold SIGINT while the dataset is closed; a Ctrl-C received meanwhile is raised afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


def _write_sidecar(out: Path, sidecar: dict[str, Any]) -> None:
    """Replace the sidecar atomically: a kill mid-write leaves the old one, never half a file."""
    tmp = out / (SIDECAR + ".tmp")
    tmp.write_text(json.dumps(sidecar, indent=1) + "\n")
    tmp.replace(out / SIDECAR)


def _sidecar(
    config: RecordConfig, sink: _Sink, scheduled: int, status: str, wall_s: float, command: Sequence[str] | None
) -> dict[str, Any]:
    counts = sink.counts(scheduled, config.tasks)
    return {
        "format": "cosmos_robot.demonstrations/v1",
        # "complete", "interrupted" (the episodes written so far form a valid dataset; a rerun resumes it) or
        # "recording" (under way, or killed: not resumable)
        "status": status,
        "command": list(command) if command is not None else list(sys.argv),
        "config": {**asdict(config), "tasks": list(config.tasks)},
        "seed_rule": SEED_RULE,
        "counts": counts,
        "throughput": {
            "wall_s": round(wall_s, 3),
            "episodes_per_min": round(60 * (counts["rolled_out"] - sink.resumed) / wall_s, 2) if wall_s > 0 else 0.0,
            "frames_per_s": round((sink.frames - sink.resumed_frames) / wall_s, 2) if wall_s > 0 else 0.0,
        },
        "privileged_features": dict(demo_layout(config.suite).privileged),
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
    for dist in ("cosmos-robot", "cosmos-robot-envs", "lerobot", "mujoco", "highway-env"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found
