"""One progress display for every long episode loop (eval, record, ...): count, fields, rate, ETA.

Why shared: each command shows the same columns and needs the same start/stop handling; only the
label and the extra fields differ. Callers subclass their own callbacks interface and hold one of
these; updates may come from worker threads (rich's ``Progress`` locks internally).

Why plain lines when the console is not a terminal: a live bar redraws in place, which a log file
cannot show (rich renders nothing until the end), so ``cosmos-robot eval ... > log 2>&1`` would be
silent for hours. Then one line is printed every ``every`` episodes or ``interval_s`` seconds
(checked as episodes finish), plus one at the start and one at the end::

    eval: 12/40 episodes, success 11/12 (91.7%), 4.1 episodes/min, elapsed 0:02:55, ETA 0:06:49
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence
from types import SimpleNamespace, TracebackType
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

__all__ = ["EpisodeBar", "count_bar"]

_B = TypeVar("_B", bound="EpisodeBar")


def count_bar(
    label: str, middle: Sequence[str], console: Console, *, after: Sequence[str] = (), disable: bool = False
) -> Progress:
    """The one bar layout: ``label ━━━ done/total <middle> elapsed ETA remaining <after>`` (text templates)."""
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(text) for text in middle),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        *(TextColumn(text) for text in after),
        console=console,
        disable=disable,
        refresh_per_second=4,
    )


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(0.0, seconds))))


class EpisodeBar:
    """``label ━━━ 12/40 episodes, <fields> 0:00:08 ETA 0:00:20``; a context manager.

    ``fields`` is a rich text template over ``task.fields`` (``"success {task.fields[success]}"``);
    the plain lines format the same template. ``plain``: None picks plain lines exactly when the
    console is not a terminal.
    """

    def __init__(
        self,
        label: str,
        fields: str,
        console: Console | None = None,
        *,
        plain: bool | None = None,
        every: int = 10,
        interval_s: float = 30.0,
    ) -> None:
        self.console = console if console is not None else Console(stderr=True)
        self.plain = not self.console.is_terminal if plain is None else plain
        self.progress = count_bar(label, [f"episodes, {fields}"], self.console, disable=self.plain)
        self.label, self.fields_template = label, fields
        self.every, self.interval_s = max(1, every), interval_s
        self.task: TaskID | None = None
        self._lock = threading.Lock()
        self._total = self._done = self._done0 = self._last_done = 0
        self._fields: dict[str, Any] = {}
        self._t0 = self._last_t = time.monotonic()

    def __enter__(self: _B) -> _B:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()
        if self.plain and self.task is not None and self._done != self._last_done:
            self._line()

    def start(self, total: int, completed: int = 0, **fields: Any) -> None:
        self.task = self.progress.add_task(self.label, total=total, completed=completed, **fields)
        with self._lock:
            self._total, self._done, self._done0, self._last_done = total, completed, completed, completed
            self._fields = dict(fields)
            self._t0 = self._last_t = time.monotonic()
        if self.plain:
            self._line()

    def advance(self, **fields: Any) -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, **fields)
        with self._lock:
            self._done += 1
            self._fields.update(fields)
            now = time.monotonic()
            due = self._done - self._last_done >= self.every or now - self._last_t >= self.interval_s
            due = due or self._done >= self._total
        if self.plain and due:
            self._line()

    def print(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)  # a log line stays one line

    def _line(self) -> None:
        """One plain progress line: done/total, the fields, rate and ETA of this run's episodes."""
        with self._lock:
            now = time.monotonic()
            self._last_done, self._last_t = self._done, now
            done, total, elapsed = self._done, self._total, now - self._t0
            ran = done - self._done0
            fields = self.fields_template.format(task=SimpleNamespace(fields=self._fields))
        rate = ran / elapsed * 60 if ran and elapsed > 0 else 0.0
        eta = _clock((total - done) / rate * 60) if rate > 0 else "0:00:00" if done >= total else "?"
        self.print(
            f"{self.label}: {done}/{total} episodes, {fields}, {rate:.1f} episodes/min, "
            f"elapsed {_clock(elapsed)}, ETA {eta}"
        )
