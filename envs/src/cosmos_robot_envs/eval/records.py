"""Per-episode records in an append-only JSONL file: the run's ground truth and its resume point.

Why JSONL appended (and flushed) one episode at a time: an interrupted run (Ctrl-C, a pre-empted
node) loses at most the episodes in flight, and a rerun with the same config reads the file, skips
the episodes already recorded and appends the rest. Since each episode's outcome depends only on its
seed (see ``config.py``), the totals of a resumed run equal those of an uninterrupted one. Every
summary (``results.json``, the HTML report) is recomputed from this file, never accumulated.

A line cut short by a crash mid-write is dropped (and cut from the file) on load.

Infrastructure failures (a simulator worker that crashed, hung or raised) are not episodes: the
policy never got to finish, so they go to ``infra_failures.jsonl`` (one :class:`InfraEvent` per
failure, with what was done about it) and never into ``episodes.jsonl``. A scheduled episode without
a record is *missing*, and a rerun of the same command runs exactly the missing ones. Records written
before this split kept infrastructure failures as episodes with a ``worker_error``;
:attr:`EpisodeRecord.infra_failure` marks them so they count as missing too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "EpisodeRecord",
    "InfraEvent",
    "append_event",
    "append_record",
    "latency_summary",
    "load_events",
    "load_records",
]


def latency_summary(latencies_ms: list[float]) -> dict[str, float]:
    """``n``, ``mean``, ``p50``, ``p95``, ``max`` (ms) of the chunk queries one episode waited for."""
    if not latencies_ms:
        return {"n": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p95_ms": 0.0, "max_ms": 0.0}
    arr = np.asarray(latencies_ms, dtype=np.float64)
    return {
        "n": int(arr.size),
        "mean_ms": round(float(arr.mean()), 3),
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p95_ms": round(float(np.percentile(arr, 95)), 3),
        "max_ms": round(float(arr.max()), 3),
    }


@dataclass
class EpisodeRecord:
    """One finished episode, as written to ``episodes.jsonl``."""

    task: str
    episode: int  # index within its task
    seed: int
    success: bool
    steps: int  # control steps taken
    episode_return: float  # sum of rewards ("return" in the JSONL)
    truncated_reason: str | None = None  # "max_steps" (or, in records of older runs, "worker_crashed" / ...)
    worker_error: str | None = None  # only in records of older runs: the failed worker's message
    latency: dict[str, float] = field(default_factory=dict)  # latency_summary of this episode's queries
    latencies_ms: list[float] = field(default_factory=list)  # every query latency this episode waited for
    video: str | None = None  # path relative to the output folder
    wall_s: float = 0.0  # wall time from reset to the last step
    infra_failures: int = 0  # attempts of this episode (same seed) lost to a failed worker before this one
    metrics: dict[str, float | bool] = field(default_factory=dict)  # the env's end-of-episode numbers (driving: ...)

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.episode)

    @property
    def infra_failure(self) -> bool:
        """A record of an older run that kept a failed worker's episode: missing, not a policy outcome."""
        return self.worker_error is not None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {("return" if k == "episode_return" else k): v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeRecord:
        data = dict(data)
        data["episode_return"] = data.pop("return")
        return cls(**data)


@dataclass
class InfraEvent:
    """One attempt of an episode lost to (or, for ``recovered``, delayed by) a failed simulator worker."""

    task: str
    episode: int
    seed: int
    attempt: int  # 1 for the episode's first failure in this run, 2 for the next, ...
    phase: str  # "reset" or "step": when the worker failed
    reason: str  # "reset_timeout", "reset_crashed", "reset_error", "worker_crashed", "worker_timeout", "env_error"
    error: str  # the failed worker's message
    action: str  # "recovered" (a fresh worker's reset went on), "retried" (rescheduled, same seed), "missing"
    steps: int = 0  # steps the lost attempt had taken

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.episode)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _append_line(path: Path, data: dict[str, Any]) -> None:
    line = json.dumps(data, separators=(",", ":"), allow_nan=False)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def append_record(path: Path, record: EpisodeRecord) -> None:
    """Append one line and push it to disk before the episode counts as done."""
    _append_line(path, record.to_json())


def append_event(path: Path, event: InfraEvent) -> None:
    """Append one infrastructure failure to ``path`` (``infra_failures.jsonl``)."""
    _append_line(path, event.to_json())


def _lines(path: Path) -> list[tuple[int, str]]:
    """Numbered non-empty lines of ``path``; an unfinished last line is removed from the file."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(keep)
        raw = raw[:keep]
    return [(n, line) for n, line in enumerate(raw.decode("utf-8").splitlines(), 1) if line.strip()]


def load_records(path: Path) -> dict[tuple[str, int], EpisodeRecord]:
    """The records in ``path`` by (task, episode), the latest per key; an unfinished last line is removed."""
    records: dict[tuple[str, int], EpisodeRecord] = {}
    for lineno, line in _lines(path):
        try:
            record = EpisodeRecord.from_json(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: not an episode record ({exc}); use --overwrite to start fresh") from exc
        records[record.key] = record
    return records


def load_events(path: Path) -> list[InfraEvent]:
    """Every infrastructure failure in ``path``, in the order they happened."""
    events: list[InfraEvent] = []
    for lineno, line in _lines(path):
        try:
            events.append(InfraEvent(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(
                f"{path}:{lineno}: not an infra failure record ({exc}); use --overwrite to start fresh"
            ) from exc
    return events
