"""A rich progress bar for :func:`run_eval`: episodes done / total, success so far, rate and ETA.

Why a callbacks object rather than a bar inside the runner: the runner also runs inside trainers and
tests, where a live terminal display is noise; the CLI opts in by passing this.
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

from cosmos_robot_envs.eval.records import EpisodeRecord
from cosmos_robot_envs.eval.runner import EvalCallbacks

__all__ = ["RichProgress"]


class RichProgress(EvalCallbacks):
    """``with RichProgress() as progress: run_eval(..., callbacks=progress)``."""

    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("episodes, success {task.fields[success]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.done = 0
        self.successes = 0

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def _success(self) -> str:
        pct = f"{100 * self.successes / self.done:.1f}%" if self.done else "-"
        return f"{self.successes}/{self.done} ({pct})"

    def start(self, total: int, done: int, successes: int) -> None:
        self.done, self.successes = done, successes
        if done:
            self.progress.console.print(f"resuming: {done} of {total} episodes already recorded")
        self.task = self.progress.add_task("eval", total=total, completed=done, success=self._success())

    def episode(self, record: EpisodeRecord) -> None:
        self.done += 1
        self.successes += int(record.success)
        if self.task is not None:
            self.progress.update(self.task, advance=1, success=self._success())
