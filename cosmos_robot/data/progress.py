"""A rich progress bar for ``cosmos-robot record``: episodes done / total, kept and failed, rate and ETA.

Why callbacks rather than a bar inside the recorder: tests and scripts call ``record_demonstrations``
without a terminal; the CLI opts in by passing this. Updates come from the writer thread, which rich's
``Progress`` allows (it locks internally).
"""

from __future__ import annotations

from types import TracebackType

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

from cosmos_robot.data.record import RecordCallbacks
from cosmos_robot.data.rollouts import Episode

__all__ = ["RichRecordProgress"]


class RichRecordProgress(RecordCallbacks):
    """``with RichRecordProgress() as bar: record_demonstrations(..., callbacks=bar)``."""

    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]record"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("episodes, kept {task.fields[kept]}, failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.kept = 0
        self.failed = 0

    def __enter__(self) -> RichRecordProgress:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def start(self, total: int) -> None:
        self.task = self.progress.add_task("record", total=total, kept=0, failed=0)

    def episode(self, episode: Episode, kept: bool) -> None:
        self.kept += int(kept)
        self.failed += int(not episode.success)
        if self.task is not None:
            self.progress.update(self.task, advance=1, kept=self.kept, failed=self.failed)
