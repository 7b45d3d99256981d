"""Write finished episodes on a background thread while the envs keep stepping.

Why: LeRobot's ``save_episode`` costs ~0.3 s per episode at 128 px (per-episode image statistics,
PNG embedding, parquet), several times the cost of simulating it. Done inline, every env would wait
for it. On a thread it overlaps with env stepping: PNG codecs, numpy reductions and the simulator
workers all run outside the GIL. The queue is bounded so a slow disk throttles the rollouts instead
of filling memory, and an error in the writer is re-raised in the caller at the next ``put`` or on exit.
Leaving the ``with`` block always waits for the item being written, even when Ctrl-C lands during
that wait: a write still running after the caller closed the dataset would corrupt it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["BackgroundWriter"]

T = TypeVar("T")
_STOP = object()


class BackgroundWriter(Generic[T]):
    """``with BackgroundWriter(write) as w: w.put(item)``: ``write(item)`` runs on one thread, in order."""

    def __init__(self, write: Callable[[T], None], max_pending: int = 8) -> None:
        self._write = write
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, max_pending))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="episode-writer", daemon=True)
        # set when the thread is done; waited on instead of join(): a Ctrl-C landing in Thread.join()
        # can leave the thread marked stopped while it still runs (CPython 3.12), and the wait is retried
        self._finished = threading.Event()

    def __enter__(self) -> BackgroundWriter[T]:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                if self._error is None:
                    try:
                        self._write(item)  # type: ignore[arg-type]
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                        self._error = exc
        finally:
            self._finished.set()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing an episode failed: {self._error}") from self._error

    def put(self, item: T) -> None:
        """Queue ``item`` (blocks while ``max_pending`` items wait); re-raises an earlier write error."""
        self._raise()
        while True:
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                self._raise()
                if self._finished.is_set():
                    raise RuntimeError("the episode writer thread stopped") from None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        interrupt: BaseException | None = None
        while True:  # the thread finishes its current item before the caller may close the dataset
            try:
                if exc_type is not None or interrupt is not None:  # interrupted: drop what is not written yet
                    self._drain()
                self._queue.put(_STOP)
                while not self._finished.wait(0.1):  # a timed wait: Ctrl-C is seen even if another thread got it
                    pass
                break
            except KeyboardInterrupt as exc:  # Ctrl-C anywhere in here: drop the rest, still wait for that item
                interrupt = exc
        if interrupt is not None:
            raise interrupt
        if exc_type is None:
            self._raise()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
