"""``cosmos-robot record``'s progress in a log file: plain lines instead of a live bar nobody sees."""

from __future__ import annotations

import io

from rich.console import Console

from cosmos_robot.data.progress import RichRecordProgress
from cosmos_robot.data.rollouts import Episode, EpisodeSpec


def test_plain_progress_lines_when_the_console_is_not_a_terminal() -> None:
    buf = io.StringIO()
    with RichRecordProgress(Console(file=buf, force_terminal=False), every=2) as bar:
        assert bar.plain
        bar.start(5)
        for i in range(5):
            bar.episode(Episode(EpisodeSpec("reach", i, i), success=i != 3), kept=i != 3)
    lines = buf.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [f"record: {n}/5 episodes" for n in (0, 2, 4, 5)]
    assert lines[-1].startswith("record: 5/5 episodes, kept 4, failed 1, ") and lines[-1].endswith("ETA 0:00:00")
    assert "\x1b[" not in buf.getvalue()


def test_a_terminal_gets_the_live_bar_only() -> None:
    buf = io.StringIO()
    with RichRecordProgress(Console(file=buf, force_terminal=True), every=1) as bar:
        assert not bar.plain
        bar.start(2)
        bar.episode(Episode(EpisodeSpec("reach", 0, 0), success=True), kept=True)
    assert "record: 1/2 episodes" not in buf.getvalue()
