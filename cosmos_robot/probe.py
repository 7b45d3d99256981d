"""``cosmos-robot probe``: talk to a policy server exactly as a robot client would, and time it.

Why a command: the first thing a robot integrator needs is "does the server answer what I
expect, and how fast?" before wiring a real robot. It prints the metadata the server announced,
the action shape it returned and a latency table (round trip vs. server-side time).

The request is the observation ``serve --warmup`` runs the policy on, rebuilt from what the server
announces: one key per input where the spec lists aliases (the LeRobot families announce every
accepted name, e.g. ``observation.images.image`` and ``observation/image``, and sending both is
an error), the first layout where it lists layouts, gray 224x224 uint8 images where the spec leaves
the image size free, zero-filled arrays and a short prompt.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cosmos_robot_client.spec import ArraySpec, InputSpec, TextSpec

__all__ = ["example_observation", "latency_summary", "run_probe"]

IMAGE_SIZE, PROMPT = 224, "do something"  # what the policies' own example observations (warm-up) use


def _chosen_keys(metadata: Mapping[str, Any], spec: InputSpec) -> list[str]:
    """One name per input: the first of each alias group (the LeRobot families' ``expected_keys``), the
    first of the ``observation_layouts`` (Cosmos3 DROID), every field otherwise."""
    groups = metadata.get("expected_keys")
    if isinstance(groups, Mapping) and groups:
        chosen = [next((n for n in names if n in spec.fields), None) for names in groups.values()]
        return [name for name in chosen if name is not None]
    layouts = metadata.get("observation_layouts")
    if isinstance(layouts, Mapping) and layouts:
        first = [k for k in next(iter(layouts.values())) if k in spec.fields]
        in_layouts = {k for layout in layouts.values() for k in layout}
        return first + [k for k, f in spec.fields.items() if k not in in_layouts and not f.optional]
    return list(spec.fields)


def _example_value(field: ArraySpec | TextSpec) -> Any:
    if isinstance(field, TextSpec):
        return PROMPT
    shape = list(field.shape)
    if len(shape) == 3 and (shape[-1] in (3, None) or shape[0] == 3):  # an image: HxWx3 (or 3xHxW)
        channels_first = shape[0] == 3 and shape[-1] != 3
        shape = [3, IMAGE_SIZE, IMAGE_SIZE] if channels_first else [IMAGE_SIZE, IMAGE_SIZE, 3]
        shape = [want if want is not None else got for want, got in zip(field.shape, shape)]
        if field.dtype in ("uint8", "number", "integer"):
            return np.full(shape, 128, dtype=np.uint8)  # gray, as the policies' example images
        return np.full(shape, 0.5, dtype=np.dtype(field.dtype if field.dtype != "floating" else "float32"))
    family = {"floating": "float32", "integer": "int64", "number": "float32", "bool": "bool"}
    return np.zeros([1 if d is None else d for d in shape], dtype=np.dtype(family.get(field.dtype, field.dtype)))


def example_observation(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The observation the server's policy warms up with (see the module docstring), or a LIBERO-sized
    openpi request when the server announces no input spec."""
    announced = metadata.get("input_spec")
    if isinstance(announced, Mapping) and announced:
        spec = InputSpec.from_dict(announced)
        return {key: _example_value(spec.fields[key]) for key in _chosen_keys(metadata, spec)}
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


def run_probe(url: str, *, requests: int, api_key: str | None, timeout_s: float, wait_s: float = 0.0) -> int:
    """Returns a process exit code (0 ok, 1 server unreachable or misbehaving).

    A refused connection (nothing listens at ``url``) fails after ``wait_s`` rather than at the
    ``timeout_s`` connect deadline."""
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

    console = Console()
    print(f"connecting to {url} ...", file=sys.stderr, flush=True)
    try:
        client = WebsocketClientPolicy(
            url,
            api_key=api_key,
            connect_timeout_s=max(timeout_s, wait_s),
            request_timeout_s=timeout_s,
            refused_timeout_s=wait_s,
        )
    except (ConnectionError, TimeoutError, OSError, ValueError) as exc:  # PermissionError is an OSError
        console.print(f"[red]error:[/red] cannot reach {url}: {escape(str(exc))}")
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
            console.print(f"[red]error:[/red] request failed: {escape(str(exc))}")
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
