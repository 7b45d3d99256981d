"""``cosmos-robot probe``: talk to a policy server exactly as a robot client would, and time it.

Why a command: the first thing a robot integrator needs is "does the server answer what I
expect, and how fast?" before wiring a real robot. It prints the metadata the server announced,
the action shape it returned and a latency table (round trip vs. server-side time).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from cosmos_robot_client.spec import InputSpec

__all__ = ["example_observation", "latency_summary", "run_probe"]


def example_observation(metadata: dict[str, Any]) -> dict[str, Any]:
    """Zeros shaped like the announced input spec, or a LIBERO-sized openpi request."""
    spec = metadata.get("input_spec")
    if isinstance(spec, dict) and spec:
        return InputSpec.from_dict(spec).example()
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": np.zeros(8, dtype=np.float64),
        "prompt": "pick up the black bowl and place it on the plate",
    }


def latency_summary(samples_ms: list[float]) -> dict[str, float]:
    arr = np.asarray(samples_ms, dtype=np.float64)
    return {
        "n": float(arr.size),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
    }


def run_probe(url: str, *, requests: int, api_key: str | None, timeout_s: float) -> int:
    """Returns a process exit code (0 ok, 1 server unreachable or misbehaving)."""
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

    console = Console()
    try:
        client = WebsocketClientPolicy(url, api_key=api_key, connect_timeout_s=timeout_s, request_timeout_s=timeout_s)
    except (ConnectionError, TimeoutError, OSError) as exc:
        console.print(f"[red]error:[/red] cannot reach {url}: {exc}")
        return 1
    with client:
        metadata = client.get_server_metadata()
        console.print(f"[bold]server metadata[/bold] from {url}:")
        console.print(metadata)
        obs = example_observation(metadata)
        round_trip: list[float] = []
        server_ms: list[float] = []
        reply: dict[str, Any] = {}
        try:
            for _ in range(max(1, requests)):
                t0 = time.perf_counter()
                reply = client.infer(obs)
                round_trip.append((time.perf_counter() - t0) * 1000)
                server_ms.append(float(reply.get("server_timing", {}).get("infer_ms", float("nan"))))
        except (RuntimeError, TimeoutError, ConnectionError) as exc:
            console.print(f"[red]error:[/red] request failed: {exc}")
            return 1
    actions = reply.get("actions")
    shape = getattr(actions, "shape", None)
    console.print(f"actions: shape {shape}, dtype {getattr(actions, 'dtype', type(actions).__name__)}")
    table = Table(title=f"{len(round_trip)} requests")
    table.add_column("latency (ms)")
    for col in ("p50", "p90", "p99", "mean"):
        table.add_column(col, justify="right")
    for name, samples in (("round trip", round_trip), ("server", server_ms)):
        s = latency_summary(samples)
        table.add_row(name, *(f"{s[c]:.2f}" for c in ("p50", "p90", "p99", "mean")))
    console.print(table)
    return 0
