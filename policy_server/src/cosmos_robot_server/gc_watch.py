"""Garbage-collector pauses: measured while serving, and kept short by freezing the warm heap.

Why (issue 19): a process serving a checkpoint holds hundreds of thousands of long-lived Python
objects (torch, transformers and LeRobot modules, tokenizers, the compiled graphs' bookkeeping). CPython's
full (generation 2) collection walks all of them while holding the GIL, so every thread stops: with a
tiny pi0.5 loaded and the server imported, 516,393 objects and 327 ms per full collection on the 2-core
CPU this was measured on (docs/benchmarks.md). Requests allocate containers (decoded msgpack maps,
batch dicts, processor transitions), so young collections run constantly and, now and then, one of
them escalates to a full collection: a latency spike that no model change can remove.

- ``freeze_heap()`` runs one full collection and moves every survivor into the permanent generation
  (``gc.freeze``). The server calls it once warm-up is over (``ServerConfig.gc_freeze``, default on):
  later full collections then walk only what was allocated while serving (the same process: 0.01 ms).
  Frozen objects are still freed by reference counting; only cycles among them are not collected
  until the last server of the process stops and unfreezes the heap (``HEAP_FREEZE``).
- ``GCWatch`` times every collection through ``gc.callbacks`` (per generation: count, total, largest,
  and a histogram), so ``/metrics`` and benchmarks show the pauses instead of leaving them to guess.
  The callback takes no lock: collections never overlap (CPython runs one at a time, with the GIL
  held), and a reader sees at worst a histogram one observation behind.
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
from typing import Any

__all__ = ["GC_BUCKETS_S", "HEAP_FREEZE", "GCWatch", "freeze_heap"]

log = logging.getLogger(__name__)

GC_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def freeze_heap() -> int:
    """One full collection, then every surviving object into the permanent generation; returns how
    many objects are frozen now (``gc.get_freeze_count``)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("gc: %d objects frozen after warm-up (%.0f ms)", frozen, (time.perf_counter() - t0) * 1e3)
    return frozen


class _HeapFreeze:
    """The permanent generation is process-wide: every server that froze the heap holds a claim, and
    the last one to stop unfreezes it (so a process that serves, stops and goes on, such as a test
    session or a notebook, collects its cycles again)."""

    def __init__(self) -> None:
        self.users = 0

    def claim(self) -> int:
        self.users += 1
        return freeze_heap()

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            gc.unfreeze()


HEAP_FREEZE = _HeapFreeze()


class _GenStats:
    __slots__ = ("count", "total_s", "max_s", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self.buckets = [0] * (len(GC_BUCKETS_S) + 1)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)
        self.buckets[bisect.bisect_left(GC_BUCKETS_S, seconds)] += 1


class GCWatch:
    """Times the collector's pauses while installed (``install()`` / ``remove()``, or ``with``)."""

    def __init__(self) -> None:
        self.generations = {g: _GenStats() for g in range(3)}
        self._t0: float | None = None
        self._installed = False

    def reset(self) -> None:
        """Forget the pauses so far (a benchmark's timed phase starts after warm-up)."""
        self.generations = {g: _GenStats() for g in range(3)}

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.generations[int(info.get("generation", 2))].add(time.perf_counter() - self._t0)
            self._t0 = None

    def install(self) -> GCWatch:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        return self

    def remove(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def __enter__(self) -> GCWatch:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def summary(self) -> dict[str, dict[str, float]]:
        """Per generation: collections, total and largest pause in ms (for benchmark reports)."""
        return {
            f"gen{g}": {"count": s.count, "total_ms": round(s.total_s * 1e3, 3), "max_ms": round(s.max_s * 1e3, 3)}
            for g, s in self.generations.items()
        }

    def render(self, name: str) -> list[str]:
        """Prometheus histogram lines of the pauses, labelled by generation."""
        lines = []
        for g, s in self.generations.items():
            cumulative = 0
            for bound, count in zip(GC_BUCKETS_S, s.buckets):
                cumulative += count
                lines.append(f'{name}_bucket{{generation="{g}",le="{bound:g}"}} {cumulative}')
            lines.append(f'{name}_bucket{{generation="{g}",le="+Inf"}} {s.count}')
            lines.append(f'{name}_sum{{generation="{g}"}} {s.total_s:g}')
            lines.append(f'{name}_count{{generation="{g}"}} {s.count}')
        return lines
