"""Progress of :func:`run_eval`: episodes done / total, success so far, rate and ETA.

Why a callbacks object rather than a bar inside the runner: the runner also runs inside trainers and
tests, where a live terminal display is noise; the CLI opts in by passing this. On a terminal it is a
rich bar; when the console is not one (output sent to a log file) it prints a plain line every few
episodes or 30 s instead (see ``cosmos_robot_envs.progress``).
"""

from __future__ import annotations

from rich.console import Console

from cosmos_robot_envs.eval.records import EpisodeRecord, InfraEvent
from cosmos_robot_envs.eval.runner import EvalCallbacks
from cosmos_robot_envs.progress import EpisodeBar

__all__ = ["RichProgress"]


class RichProgress(EpisodeBar, EvalCallbacks):
    """``with RichProgress() as progress: run_eval(..., callbacks=progress)``."""

    def __init__(
        self, console: Console | None = None, *, plain: bool | None = None, every: int = 10, interval_s: float = 30.0
    ) -> None:
        super().__init__(
            "eval", "success {task.fields[success]}", console, plain=plain, every=every, interval_s=interval_s
        )
        self.done = 0
        self.successes = 0

    def _success(self) -> str:
        pct = f"{100 * self.successes / self.done:.1f}%" if self.done else "-"
        return f"{self.successes}/{self.done} ({pct})"

    def start(self, total: int, done: int, successes: int) -> None:  # type: ignore[override]
        self.done, self.successes = done, successes
        if done:
            self.print(f"resuming: {done} of {total} episodes already recorded")
        super().start(total, completed=done, success=self._success())

    def episode(self, record: EpisodeRecord) -> None:
        self.done += 1
        self.successes += int(record.success)
        self.advance(success=self._success())

    def infra_failure(self, event: InfraEvent) -> None:
        what = {
            "recovered": "a fresh worker's reset went on",
            "retried": "running it again with the same seed",
            "missing": "no retry left: left missing, rerun the same command to complete it",
        }[event.action]
        self.print(
            f"infra failure ({event.reason}, in {event.phase}) on {event.task} #{event.episode} (seed {event.seed}), "
            f"attempt {event.attempt}: {what}; not counted as the policy's"
        )
