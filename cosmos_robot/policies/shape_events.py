"""Compilations and graph captures a served policy has done: none may happen after ``/readyz``.

Why: a GPU policy is fast because its shapes are compiled (``torch.compile``) and captured (CUDA
graphs, :mod:`.cuda_graphs`) ahead of time. A batch size, prompt length or image layout the warm-up
did not cover compiles or captures in the middle of serving: hundreds of milliseconds to minutes in
one request's latency, which is exactly the p99 a robot's control loop cannot absorb. Every torch
policy therefore reports three monotonic counters through ``runtime_counters()``:

- ``compiles``: graphs Dynamo has compiled in this process (``torch._dynamo`` counts a recompile for
  a new shape as one more; the count is process-wide, and a server process holds one policy);
- ``graph_captures``: CUDA graphs captured by the policy's :class:`GraphCache` objects;
- ``shape_misses``: calls whose input signature none of those caches held. On CUDA each one is a
  capture; on a CPU (graphs off) it is the capture that a GPU would have made, so a CPU test proves
  the shape discipline the GPU relies on.

The server reads them after warm-up and counts any increase as ``cosmos_robot_after_ready_total``
(``kind`` = the counter) with a warning in its log (``cosmos_robot_server.core``).
"""

from __future__ import annotations

from collections.abc import Iterable

from cosmos_robot.policies.cuda_graphs import GraphCache

__all__ = ["ShapeCounted", "dynamo_compiles", "runtime_counters"]


def dynamo_compiles() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (recompilations included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def runtime_counters(caches: Iterable[GraphCache | None]) -> dict[str, int]:
    """``compiles``, ``graph_captures`` and ``shape_misses`` of a policy whose graph caches are ``caches``."""
    live = [c for c in caches if c is not None]
    return {
        "compiles": dynamo_compiles(),
        "graph_captures": sum(c.captures for c in live),
        "shape_misses": sum(c.shape_misses for c in live),
    }


class ShapeCounted:
    """Mixin of the torch policies: ``runtime_counters()`` over the caches ``graph_caches()`` names."""

    def graph_caches(self) -> list[GraphCache | None]:
        return []

    def runtime_counters(self) -> dict[str, int]:
        return runtime_counters(self.graph_caches())
