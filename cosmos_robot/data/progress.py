"""Progress of ``cosmos-robot record``: episodes done / total, kept and failed, rate and ETA.

A rich bar on a terminal; plain lines every few episodes or 30 s when the console is not one (a log
file), so a long recording is not silent (see ``cosmos_robot_envs.progress``).

Why callbacks rather than a bar inside the recorder: tests and scripts call ``record_demonstrations``
without a terminal; the CLI opts in by passing this. Updates come from the writer thread, which rich's
``Progress`` allows (it locks internally).
"""

from __future__ import annotations

from rich.console import Console

from cosmos_robot.data.record import RecordCallbacks
from cosmos_robot.data.rollouts import Episode
from cosmos_robot_envs.progress import EpisodeBar

__all__ = ["RichRecordProgress"]


class RichRecordProgress(EpisodeBar, RecordCallbacks):
    """``with RichRecordProgress() as bar: record_demonstrations(..., callbacks=bar)``."""

    def __init__(
        self, console: Console | None = None, *, plain: bool | None = None, every: int = 10, interval_s: float = 30.0
    ) -> None:
        fields = "kept {task.fields[kept]}, failed {task.fields[failed]}"
        super().__init__("record", fields, console, plain=plain, every=every, interval_s=interval_s)
        self.kept = 0
        self.failed = 0

    def start(self, total: int) -> None:  # type: ignore[override]
        super().start(total, kept=0, failed=0)

    def episode(self, episode: Episode, kept: bool) -> None:
        self.kept += int(kept)
        self.failed += int(not episode.success)
        self.advance(kept=self.kept, failed=self.failed)
