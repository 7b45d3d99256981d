"""CUDA graphs for served models: one captured graph per input signature, replayed per call.

Why: at batch 1 the VLA models we serve are bound by launching kernels, not by arithmetic (a
pi0.5 chunk or a GR00T chunk issues thousands of small kernels from Python). Captured once, a
chunk replays with one launch. :class:`GraphCache` is the mechanism the families share: inputs
are copied into static buffers, the output is cloned out of the graph's memory pool, graphs of one
cache share a pool, the least recently used graph is dropped past ``max_graphs``. Batches are
padded to a power of two (:func:`bucket_size`, :func:`pad_rows`) by the callers, so a server that
forms batches of every size from 1 to 8 sees four captures, not eight.

On a CPU (or with ``enabled=False``) the function just runs, under the same autocast; the cache
still counts the new signatures it meets (``shape_misses``), each of which would be a capture on a
GPU, so a CPU test can prove that serving after warm-up meets no new shape (:mod:`.shape_events`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["CAPTURE_LOCK", "CaptureLock", "GraphCache", "GraphCaptureError", "bucket_size", "pad_rows"]


class CaptureLock:
    """Shared by calls that may run side by side (policy replicas), exclusive for a CUDA graph capture.

    A capture records every kernel launched on the device in that window (``torch.cuda.graph``'s
    default "global" mode refuses other threads' unsafe calls, and empties the allocator's cache), so
    no other replica may work meanwhile. A thread that captures inside its own shared hold gives that
    hold up while it waits, so two replicas meeting new shapes at once capture one after the other
    instead of deadlocking. Waiting captures go before new calls."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared: dict[int, int] = {}  # thread -> shared holds
        self._writer: int | None = None
        self._writer_depth = 0
        self._waiting_writers = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if me not in self._shared:  # a thread already holding it re-enters at once
                while self._writer not in (None, me) or (self._waiting_writers and self._writer != me):
                    self._cond.wait()
            self._shared[me] = self._shared.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._shared[me] - 1
                if left:
                    self._shared[me] = left
                else:
                    del self._shared[me]
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            held = self._shared.pop(me, 0)  # give up this thread's own shared holds while it waits
            self._waiting_writers += 1
            self._cond.notify_all()
            while self._writer not in (None, me) or self._shared:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer, self._writer_depth = me, self._writer_depth + 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if not self._writer_depth:
                    self._writer = None
                if held:
                    self._shared[me] = held
                self._cond.notify_all()


CAPTURE_LOCK = CaptureLock()  # process-wide: every GraphCache captures under it


class GraphCaptureError(RuntimeError):
    """Warming up or capturing a function as a CUDA graph failed (the function is not capturable as
    called: a host sync, a data-dependent shape, an operation the capture refuses)."""


def bucket_size(n: int) -> int:
    """The captured batch size that serves ``n`` observations: the next power of two.

    A server's batches vary in size from call to call; without buckets every new size would cost a
    capture (and, compiled, a recompilation of seconds to minutes) in the middle of serving."""
    if n < 1:
        raise ValueError(f"batch size must be at least 1, got {n}")
    return 1 << (n - 1).bit_length()


def pad_rows(t: Tensor, size: int) -> Tensor:
    """``t`` with its last row repeated up to ``size`` rows (padding rows are computed, then dropped)."""
    if t.shape[0] == size:
        return t
    if t.shape[0] > size:
        raise ValueError(f"cannot pad {t.shape[0]} rows down to {size}")
    return torch.cat([t, t[-1:].expand(size - t.shape[0], *t.shape[1:])], dim=0)


Signature = tuple[Any, ...]


class GraphCache:
    """``cache(*tensors, **static) -> fn(*tensors, **static)``, replayed from a graph per signature.

    The signature is the tensors' shapes, dtypes and devices (``None`` allowed in place of a tensor)
    plus the ``static`` keyword values, which ``fn`` may use as Python values (they are baked into
    the graph). ``fn`` must be capturable: no host syncs, no data-dependent shapes.
    """

    def __init__(
        self,
        fn: Callable[..., Tensor],
        enabled: bool = True,
        autocast_dtype: torch.dtype | None = None,
        max_graphs: int = 8,
    ) -> None:
        self.fn, self.enabled, self.autocast_dtype, self.max_graphs = fn, enabled, autocast_dtype, max_graphs
        self.graphs: OrderedDict[Signature, tuple[torch.cuda.CUDAGraph, list[Tensor | None], Tensor]] = OrderedDict()
        self._pool: Any = None
        self.captures = 0  # graphs captured (a recapture after an eviction counts again)
        self.shape_misses = 0  # calls with a signature not cached: a capture on CUDA, counted off it too
        self._seen: OrderedDict[Signature, None] = OrderedDict()  # signatures met with graphs off

    def fresh(self, fn: Callable[..., Tensor] | None = None) -> GraphCache:
        """An empty cache with the same settings, of ``fn`` (default: the same function): a policy
        replica's own graphs."""
        return GraphCache(self.fn if fn is None else fn, self.enabled, self.autocast_dtype, self.max_graphs)

    def _autocast(self, device: torch.device) -> Any:
        # no weight-cast cache: a graph must not capture casts made outside it
        return torch.autocast(
            device_type=device.type,
            dtype=self.autocast_dtype or torch.bfloat16,
            enabled=self.autocast_dtype is not None,
            cache_enabled=False,
        )

    def __call__(self, *inputs: Tensor | None, **static: Any) -> Tensor:
        first = next((t for t in inputs if t is not None), None)
        if first is None:
            raise ValueError("GraphCache needs at least one tensor input")
        key = (
            tuple(None if t is None else (tuple(t.shape), t.dtype, t.device) for t in inputs),
            tuple(sorted(static.items())),
        )
        if not (self.enabled and first.is_cuda):
            self._note_eager(key)
            with self._autocast(first.device):
                return self.fn(*inputs, **static)
        if key not in self.graphs:
            self.shape_misses += 1
            try:
                with CAPTURE_LOCK.exclusive():  # no other replica works on the device meanwhile
                    self.graphs[key] = self._capture(inputs, static, first.device)
            except RuntimeError as exc:
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    raise
                name = getattr(self.fn, "__name__", None) or getattr(getattr(self.fn, "func", None), "__name__", "fn")
                raise GraphCaptureError(f"capturing {name} as a CUDA graph failed: {exc}") from exc
            self.captures += 1
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        graph, buffers, out = self.graphs[key]
        for buffer, value in zip(buffers, inputs, strict=True):
            if buffer is not None and value is not None:
                buffer.copy_(value, non_blocking=True)
        graph.replay()
        return out.clone()

    def _note_eager(self, key: Signature) -> None:
        """Count a signature the graphs would not hold (same LRU bound), as a capture would be counted."""
        if key in self._seen:
            self._seen.move_to_end(key)
            return
        self.shape_misses += 1
        self._seen[key] = None
        while len(self._seen) > self.max_graphs:
            self._seen.popitem(last=False)

    def _capture(
        self, inputs: tuple[Tensor | None, ...], static: dict[str, Any], device: torch.device
    ) -> tuple[torch.cuda.CUDAGraph, list[Tensor | None], Tensor]:
        buffers = [None if t is None else t.clone() for t in inputs]
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), self._autocast(device):
            for _ in range(2):  # warm up outside the graph (allocator, kernel selection, compilation)
                self.fn(*buffers, **static)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool), self._autocast(device):
            out = self.fn(*buffers, **static)
        return graph, buffers, out
