"""Metrics to ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard, resume-aware.

Why both: JSONL is what scripts, tests and the learning-curve plot read (no TensorBoard parser
needed); TensorBoard is what people open while a run is going. Why resume-aware: a run killed after
logging step 1200 but last checkpointed at step 1000 replays steps 1001-1200 when resumed; the
lines past the checkpoint are dropped from the JSONL, and TensorBoard is told to purge its events
past that step, so each step appears exactly once in both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "NullMetricsLogger", "read_metrics"]

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a folder or the file); a torn last line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


class MetricsLogger:
    """Append-only metric records keyed by ``step``; ``resume_step`` drops records after it."""

    def __init__(self, out_dir: str | Path, resume_step: int = 0, tensorboard: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / METRICS_FILE
        kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= resume_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._fh = self.path.open("a")
        self._writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=resume_step + 1)

    def log(self, step: int, values: dict[str, Any]) -> None:
        record = {"step": step, **values}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)

    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        if self._writer is not None:
            self._writer.add_text(tag, text, step)

    def close(self) -> None:
        self._fh.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullMetricsLogger(MetricsLogger):
    """The logger of a rank that does not write the run folder (data parallel: rank 0 logs the global
    batch's metrics, which every rank computes alike)."""

    def __init__(self) -> None:  # no folder, no files
        pass

    def log(self, step: int, values: dict[str, Any]) -> None:
        pass

    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        pass

    def close(self) -> None:
        pass
