"""Timing helpers shared by the latency benchmarks (pi05, GR00T).

``measure`` times a call CUDA-synchronised after warm-up calls (first calls compile, capture and
tune kernels). ``server_latency`` measures the chunk latency through our websocket server, as a
robot sees it: it starts a ``PolicyServer`` on loopback around an already-loaded policy, warms it the
way ``serve --warmup auto`` does on a GPU (every power-of-two batch bucket up to ``batch``, so that
compilation and graph captures happen before the clock starts, not in the measured requests), then
times ``batch`` concurrent websocket clients, each sending ``iters`` requests; the server batches
whatever arrives together. Returns p50/p99 of the per-request round trip in milliseconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def write_report(report: dict[str, Any], out: Path | None) -> int:
    """Print the benchmark's JSON report and write it to ``out`` when given; the exit code (0)."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        out.write_text(text)
    return 0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def p50_p99(times_ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(times_ms, 50)), 2),
        "p99_ms": round(float(np.percentile(times_ms, 99)), 2),
    }


def gc_pauses(watch: Any) -> dict[str, float]:
    """A ``GCWatch``'s collections while it ran: how many, and the largest pause (ms) per generation
    (a full, generation-2 collection stops every thread: docs/benchmarks.md, issue 19)."""
    out: dict[str, float] = {}
    for gen, row in watch.summary().items():
        out[f"gc_{gen}_n"] = row["count"]
        out[f"gc_{gen}_max_ms"] = row["max_ms"]
    return out


def measure(fn: Callable[[], object], iters: int, device: str, warmup: int = 3) -> dict[str, float]:
    """p50/p99 in ms of ``iters`` calls of ``fn`` after ``warmup`` calls, synchronised on CUDA, with
    the garbage collector's pauses during the timed calls."""
    from cosmos_robot_server.gc_watch import GCWatch

    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    with GCWatch() as watch:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return {**p50_p99(times), **gc_pauses(watch)}


def server_latency(
    policy: Any, batch: int, iters: int, obs: list[dict], start_timeout_s: float = 600.0
) -> dict[str, float]:
    from cosmos_robot.cli import warmup_batches
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
    from cosmos_robot_server import PolicyServer, ServerConfig

    config = ServerConfig(
        port=0, transports=("ws",), max_batch_size=max(batch, 1), warmup_batches=warmup_batches("auto", batch, "cuda")
    )
    server = PolicyServer(policy, config).start_in_thread(timeout_s=start_timeout_s)
    try:
        clients = [WebsocketClientPolicy("127.0.0.1", server.ports["ws"]) for _ in range(batch)]
        for c, o in zip(clients, obs, strict=False):
            c.infer(o)  # one round trip each: connections open, nothing left to set up
        times: list[float] = []
        lock = threading.Lock()

        def worker(i: int) -> None:
            for _ in range(iters):
                t0 = time.perf_counter()
                clients[i].infer(obs[i % len(obs)])
                with lock:
                    times.append((time.perf_counter() - t0) * 1e3)

        server.core.gc_watch.reset()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in clients:
            c.close()
        pauses = gc_pauses(server.core.gc_watch)  # during the timed requests
    finally:
        server.stop()
    return {**p50_p99(times), **pauses}
