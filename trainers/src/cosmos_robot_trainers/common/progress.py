"""A rich progress bar for training loops: steps, rate, elapsed, ETA and the latest metrics.

Why a thin wrapper: every trainer (SFT now, RL later) shows the same columns, and tests or
non-interactive runs pass ``enabled=False`` to get a no-op with the same methods.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["TrainProgress"]


class TrainProgress:
    """``with TrainProgress(total, start, "sft") as bar: bar.update(step, {"loss": 0.1})``."""

    def __init__(self, total: int, start: int = 0, description: str = "train", enabled: bool = True) -> None:
        self.total, self.start, self.description, self.enabled = total, start, description, enabled
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("[cyan]{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(stderr=True),
                refresh_per_second=4,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(
                self.description, total=self.total, completed=self.start, rate="", info=""
            )
        return self

    def update(self, step: int, metrics: dict[str, Any] | None = None, rate: float | None = None) -> None:
        if self._progress is None or self._task is None:
            return
        info = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (metrics or {}).items())
        fields: dict[str, Any] = {"info": info} if metrics is not None else {}
        if rate is not None:
            fields["rate"] = f"{rate:.2f} steps/s"
        self._progress.update(self._task, completed=step, **fields)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None
