"""Prometheus text-format metrics, written by hand so the server needs no metrics dependency.

Counters and histograms are updated from the event loop and from HTTP threads, hence the lock.
Exposed on ``GET /metrics`` of the websocket and HTTP ports.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

from cosmos_robot_server.gc_watch import GCWatch

__all__ = ["Metrics"]

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Labels = tuple[tuple[str, str], ...]


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


def _fmt_labels(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{v}"' for k, v in items)
    return "{" + body + "}"


class Metrics:
    """Request, error, latency and batch-size metrics of one server."""

    _HELP = {
        "cosmos_robot_requests_total": ("counter", "Inference requests answered, by transport and outcome."),
        "cosmos_robot_errors_total": ("counter", "Failed requests, by transport and error kind."),
        "cosmos_robot_connections": ("gauge", "Open client connections, by transport."),
        "cosmos_robot_request_latency_seconds": ("histogram", "Request latency from receipt to reply."),
        "cosmos_robot_policy_latency_seconds": ("histogram", "Duration of one policy call (one batch)."),
        "cosmos_robot_batch_size": ("histogram", "Observations per policy call."),
        "cosmos_robot_after_ready_total": (
            "counter",
            "Compilations, CUDA-graph captures and unseen input shapes after /readyz (warm-up missed them), by kind.",
        ),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._gauges: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._hists: dict[str, dict[Labels, _Histogram]] = defaultdict(dict)
        self.gc_watch: GCWatch | None = None  # the serving core's collector pauses, rendered when set

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._counters[name][tuple(sorted(labels.items()))] += value

    def gauge_add(self, name: str, delta: float, **labels: str) -> None:
        with self._lock:
            self._gauges[name][tuple(sorted(labels.items()))] += delta

    def observe(self, name: str, value: float, **labels: str) -> None:
        buckets = BATCH_BUCKETS if name == "cosmos_robot_batch_size" else LATENCY_BUCKETS_S
        key = tuple(sorted(labels.items()))
        with self._lock:
            hist = self._hists[name].get(key)
            if hist is None:
                hist = self._hists[name][key] = _Histogram(tuple(float(b) for b in buckets))
            hist.observe(value)

    def counter_value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            for name, (kind, text) in self._HELP.items():
                lines.append(f"# HELP {name} {text}")
                lines.append(f"# TYPE {name} {kind}")
                if kind == "counter":
                    for labels, value in sorted(self._counters[name].items()):
                        lines.append(f"{name}{_fmt_labels(labels)} {value:g}")
                elif kind == "gauge":
                    for labels, value in sorted(self._gauges[name].items()):
                        lines.append(f"{name}{_fmt_labels(labels)} {value:g}")
                else:
                    for labels, hist in sorted(self._hists[name].items()):
                        cumulative = 0
                        for bound, count in zip(hist.buckets, hist.counts):
                            cumulative += count
                            lines.append(f"{name}_bucket{_fmt_labels(labels, (('le', f'{bound:g}'),))} {cumulative}")
                        lines.append(f"{name}_bucket{_fmt_labels(labels, (('le', '+Inf'),))} {hist.n}")
                        lines.append(f"{name}_sum{_fmt_labels(labels)} {hist.total:g}")
                        lines.append(f"{name}_count{_fmt_labels(labels)} {hist.n}")
        if self.gc_watch is not None:  # outside the lock: the watch keeps its own (lock-free) counts
            name = "cosmos_robot_gc_pause_seconds"
            lines.append(f"# HELP {name} Python garbage-collector pauses (every thread stops), by generation.")
            lines.append(f"# TYPE {name} histogram")
            lines.extend(self.gc_watch.render(name))
        return "\n".join(lines) + "\n"
