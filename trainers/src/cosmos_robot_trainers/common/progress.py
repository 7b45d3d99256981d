"""Training progress: a rich bar on a terminal, plain lines when stderr is a file or a pipe.

Why two forms: a bar redraws one line in place, which a log file, ``nohup``, a CI job or ``tee``
shows as nothing at all (rich suppresses the live display off a terminal). There, a line such as
``sft: step 400/2000 (20%), 12.3 steps/s, elapsed 0:32, eta 2:10, loss=0.0412`` is printed on an
``update`` once ``every_steps`` steps (about 20 lines per run by default) or ``every_s`` seconds have
passed since the last line, and at the end. ``enabled=False`` (tests, ``train.progress = false``)
prints nothing.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import Progress, TaskID

from cosmos_robot_envs.progress import count_bar

__all__ = ["TrainProgress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1:02:05``, ``65`` -> ``1:05``."""
    total = int(max(seconds, 0))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _metrics_text(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


class TrainProgress:
    """``with TrainProgress(total, start, "sft") as bar: bar.update(step, {"loss": 0.1})``."""

    def __init__(
        self,
        total: int,
        start: int = 0,
        description: str = "train",
        enabled: bool = True,
        *,
        console: Console | None = None,  # default: stderr
        every_steps: int | None = None,  # plain lines: one when this many steps passed (default: total / 20)
        every_s: float = 30.0,  # ... or when this many seconds passed, whichever comes first
        unit: str = "step",  # what is counted ("iteration" for RL)
        plain_lines: bool = True,  # off a terminal, print plain lines (False: the caller logs its own)
    ) -> None:
        self.total, self.start, self.description, self.enabled = total, start, description, enabled
        self.console = console if console is not None else Console(stderr=True)
        self.every_steps = every_steps if every_steps is not None else max(1, -(-total // 20))
        self.every_s = every_s
        self.unit, self.plain_lines = unit, plain_lines
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._plain = False
        self._t0 = 0.0
        self._last_line: tuple[int, float] = (start, 0.0)  # (step, time) of the last plain line
        self._step = start
        self._rate: float | None = None  # the trainer's latest steps/s (None: from the elapsed time)
        self._info = ""  # the latest metrics as text

    def __enter__(self) -> TrainProgress:
        if not self.enabled:
            return self
        self._t0 = time.monotonic()
        self._last_line = (self.start, self._t0)
        if not self.console.is_terminal:
            self._plain = self.plain_lines
            return self
        self._progress = count_bar(
            self.description, ["[cyan]{task.fields[rate]}"], self.console, after=["{task.fields[info]}"]
        )
        self._progress.__enter__()
        self._task = self._progress.add_task(self.description, total=self.total, completed=self.start, rate="", info="")
        return self

    def update(self, step: int, metrics: dict[str, Any] | None = None, rate: float | None = None) -> None:
        if metrics is not None:
            self._info = _metrics_text(metrics)
        if rate is not None:
            self._rate = rate
        self._step = step
        if self._plain:
            last_step, last_t = self._last_line
            now = time.monotonic()
            if step - last_step >= self.every_steps or now - last_t >= self.every_s or step >= self.total:
                self._print_line(now)
            return
        if self._progress is None or self._task is None:
            return
        fields: dict[str, Any] = {"info": self._info} if metrics is not None else {}
        if rate is not None:
            fields["rate"] = f"{rate:.2f} {self.unit}s/s"
        self._progress.update(self._task, completed=step, **fields)

    def _print_line(self, now: float) -> None:
        elapsed = now - self._t0
        done = self._step - self.start
        rate = self._rate if self._rate is not None else (done / elapsed if elapsed > 0 else None)
        parts = [f"{self.unit} {self._step}/{self.total} ({100 * self._step / max(self.total, 1):.0f}%)"]
        if rate:
            parts.append(f"{rate:.2f} {self.unit}s/s")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if rate and self._step < self.total:
            parts.append(f"eta {format_duration((self.total - self._step) / rate)}")
        text = f"{self.description}: {', '.join(parts)}" + (f", {self._info}" if self._info else "")
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self._last_line = (self._step, now)

    def __exit__(self, *exc: object) -> None:
        if self._plain:
            if self._step != self._last_line[0]:  # stopped between lines (interrupted, time cap): say where
                self._print_line(time.monotonic())
            self._plain = False
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None
