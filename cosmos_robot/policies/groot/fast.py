"""GR00T N1.7's flow loop, replayed as one CUDA graph per input shape.

Why: LeRobot's ``predict_action_chunk`` at N1.7-3B's size takes about the same time at batch 1 and
8 on an H200 (288 / 268 ms, docs/benchmarks.md): it is bound by launching kernels, not by
arithmetic. Most of them are the action head's: 4 Euler steps through the 32-layer DiT, each a few
thousand small kernels issued from Python. Captured once as a CUDA graph, the four steps replay
with one launch.

:func:`euler_loop` is GR00T's own loop (``GR00TN17ActionHead.get_action_with_features`` without
real-time chunking) written as a pure function of tensors, so it can be captured; given the same
starting noise it computes what LeRobot computes (a test compares them). :class:`GraphedEulerLoop`
keeps one graph per shape (batch size, number of VL tokens, dtype), least recently used first out;
on a CPU it just runs the loop.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

__all__ = ["GraphedEulerLoop", "dit_velocity", "euler_loop"]


def dit_velocity(
    head: Any,
    actions: Tensor,
    timesteps: Tensor,
    vl: Tensor,
    state_features: Tensor,
    embodiment_id: Tensor,
    image_mask: Tensor | None,
    attention_mask: Tensor | None,
) -> Tensor:
    """One pass of GR00T's action head: its velocity (``actions - noise`` in GR00T's time) for the
    chunk ``actions`` at the bucketed ``timesteps`` (B,). Shared by serving and the RL adapter."""
    features = head.action_encoder(actions, timesteps, embodiment_id)
    if head.config.add_pos_embed:
        positions = torch.arange(features.shape[1], dtype=torch.long, device=features.device)
        features = features + head.position_embedding(positions).unsqueeze(0)
    sequence = torch.cat((state_features, features), dim=1)
    if head.config.use_alternate_vl_dit:
        out = head.model(
            hidden_states=sequence,
            encoder_hidden_states=vl,
            timestep=timesteps,
            image_mask=image_mask,
            backbone_attention_mask=attention_mask,
        )
    else:
        out = head.model(hidden_states=sequence, encoder_hidden_states=vl, timestep=timesteps)
    velocity: Tensor = head.action_decoder(out, embodiment_id)[:, -head.action_horizon :]
    return velocity


def euler_loop(
    head: Any,
    vl: Tensor,
    state_features: Tensor,
    embodiment_id: Tensor,
    image_mask: Tensor | None,
    attention_mask: Tensor | None,
    actions: Tensor,
) -> Tensor:
    """``head.num_inference_timesteps`` Euler steps from ``actions`` (the noise), as GR00T takes them."""
    steps = int(head.num_inference_timesteps)
    dt = 1.0 / steps
    for step in range(steps):
        bucket = int(step / float(steps) * head.num_timestep_buckets)
        timesteps = torch.full((vl.shape[0],), bucket, device=vl.device)
        pred = dit_velocity(head, actions, timesteps, vl, state_features, embodiment_id, image_mask, attention_mask)
        actions = actions + dt * pred
    return actions


class GraphedEulerLoop:
    """``loop(vl, state_features, embodiment_id, image_mask, attention_mask, noise) -> actions``."""

    def __init__(self, head: Any, use_graphs: bool, autocast_dtype: torch.dtype | None, max_graphs: int = 8) -> None:
        self.head, self.use_graphs, self.autocast_dtype, self.max_graphs = head, use_graphs, autocast_dtype, max_graphs
        self._graphs: OrderedDict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, list[Tensor | None], Tensor]] = (
            OrderedDict()
        )

    def _autocast(self, device: torch.device) -> Any:
        # no weight-cast cache: a graph must not capture casts made outside it
        return torch.autocast(
            device_type=device.type,
            dtype=self.autocast_dtype or torch.bfloat16,
            enabled=self.autocast_dtype is not None,
            cache_enabled=False,
        )

    def __call__(self, *inputs: Tensor | None) -> Tensor:
        vl = inputs[0]
        assert vl is not None
        if not (self.use_graphs and vl.is_cuda):
            with self._autocast(vl.device):
                return euler_loop(self.head, *inputs)  # type: ignore[arg-type]
        key = tuple((None if t is None else (tuple(t.shape), t.dtype)) for t in inputs)
        if key not in self._graphs:
            self._graphs[key] = self._capture(inputs)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        graph, static, out = self._graphs[key]
        for buffer, value in zip(static, inputs, strict=True):
            if buffer is not None and value is not None:
                buffer.copy_(value)
        graph.replay()
        return out.clone()

    def _capture(self, inputs: tuple[Tensor | None, ...]) -> tuple[torch.cuda.CUDAGraph, list[Tensor | None], Tensor]:
        static = [None if t is None else t.clone() for t in inputs]
        device = static[0].device  # type: ignore[union-attr]
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), self._autocast(device):
            for _ in range(2):  # warm up outside the graph (allocator, kernel selection)
                euler_loop(self.head, *static)  # type: ignore[arg-type]
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), self._autocast(device):
            out = euler_loop(self.head, *static)  # type: ignore[arg-type]
        return graph, static, out
