"""One rich progress bar for every long episode loop (eval, record, ...): count, fields, rate, ETA.

Why shared: each command shows the same columns and needs the same start/stop handling; only the
label and the extra fields differ. Callers subclass their own callbacks interface and hold one of
these; updates may come from worker threads (rich's ``Progress`` locks internally).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeVar

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

__all__ = ["EpisodeBar"]

_B = TypeVar("_B", bound="EpisodeBar")


class EpisodeBar:
    """``label ━━━ 12/40 episodes, <fields> 0:00:08 ETA 0:00:20``; a context manager."""

    def __init__(self, label: str, fields: str, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(f"episodes, {fields}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.label = label
        self.task: TaskID | None = None

    def __enter__(self: _B) -> _B:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def start(self, total: int, completed: int = 0, **fields: Any) -> None:
        self.task = self.progress.add_task(self.label, total=total, completed=completed, **fields)

    def advance(self, **fields: Any) -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, **fields)

    def print(self, message: str) -> None:
        self.progress.console.print(message)
