"""Policy replicas for concurrent serving: copies that share the weights, not the per-call state.

Why: the server's batcher (``cosmos_robot_server.batcher``) runs one call at a time per policy. A
request that arrives while a batch runs waits for that whole call and then its own, so at a robot's
pace p99 approaches twice p50. With ``serve --replicas 2`` a second worker calls a replica at once,
beside the running batch, on its own CUDA stream, so the GPU overlaps the two.

What a replica owns: its CUDA graphs (a graph's static input buffers and memory pool belong to one
caller: :meth:`GraphCache.fresh`), its CUDA stream (made current on its worker thread by
``bind_thread``: the current stream is per thread in PyTorch), and copies of the host-side
processors (a Hugging Face fast tokenizer refuses concurrent use: "Already borrowed"). Weights,
compiled code and configuration are shared. Random draws of the torch families come from private
generators seeded per call, never from the global RNG, so concurrent calls give the same chunks as
one at a time (a test compares them).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from cosmos_robot.policies.cuda_graphs import CAPTURE_LOCK

__all__ = ["Replicable"]


class Replicable:
    """Mixin: ``replica()`` and ``bind_thread()`` for a policy whose per-call state is named by
    ``REPLICA_PRIVATE`` (deep-copied) and whose graph caches ``renew_graph_caches()`` replaces."""

    REPLICA_PRIVATE: tuple[str, ...] = ("preprocessor", "postprocessor", "tokenizer")
    _serving_stream: Any = None

    def renew_graph_caches(self) -> None:
        """Give this (copied) policy graph caches of its own; a family with graphs overrides it."""

    def replica(self) -> Any:
        """A policy that shares this one's weights and can serve at the same time on another thread."""
        twin = copy.copy(self)
        names = [n for n in self.REPLICA_PRIVATE if getattr(self, n, None) is not None]
        # one deepcopy for all of them: links between them survive (LeRobot's GR00T postprocessor reads
        # the raw state its preprocessor's pack step saved, to turn relative actions back into absolute)
        for name, value in zip(names, copy.deepcopy(tuple(getattr(self, n) for n in names)), strict=True):
            setattr(twin, name, value)
        twin.renew_graph_caches()
        twin._serving_stream = None
        return twin

    def call_guard(self) -> Any:
        """Held around every call while replicas serve (``DynamicBatcher``): calls run side by side, but
        never during a CUDA graph capture, which may not overlap other work on the device
        (:data:`cuda_graphs.CAPTURE_LOCK`)."""
        return CAPTURE_LOCK.shared()

    def bind_thread(self) -> None:
        """Run first on the worker thread that serves this policy: on CUDA, its own stream becomes that
        thread's current stream (graph replays, copies and kernels of its calls go there)."""
        device = torch.device(getattr(self, "device", "cpu"))
        if device.type != "cuda":
            return
        if self._serving_stream is None:
            self._serving_stream = torch.cuda.Stream(device)
        torch.cuda.set_stream(self._serving_stream)
