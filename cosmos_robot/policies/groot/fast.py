"""A GR00T N1.7 action chunk as one function of tensors, so a CUDA graph can replay all of it.

Why: LeRobot's ``predict_action_chunk`` at N1.7-3B's size takes about the same time at batch 1 and
8 on an H200 (docs/benchmarks.md): it is bound by launching kernels and by host syncs, not by
arithmetic. The action head runs 4 Euler steps through the 32-layer DiT, each a few thousand small
kernels issued from Python; the backbone plans positions and image splits on the CPU mid-forward.

:func:`euler_loop` is GR00T's own loop (``GR00TN17ActionHead.get_action_with_features`` without
real-time chunking) written as a pure function of tensors; given the same starting noise it
computes what LeRobot computes (a test compares them). :func:`chunk_from_inputs` puts the
backbone (:mod:`.backbone`, planned outside), the head's encoders and the loop together, so the
policy replays a whole chunk from one :class:`~cosmos_robot.policies.cuda_graphs.GraphCache` graph
per input signature; on a CPU it just runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cosmos_robot.policies.groot.backbone import BackbonePlan, FastQwen3Backbone

__all__ = ["chunk_from_inputs", "dit_velocity", "euler_loop"]


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


def chunk_from_inputs(
    backbone: FastQwen3Backbone,
    head: Any,
    pixel_values: Tensor,
    input_ids: Tensor,
    state: Tensor,
    embodiment_id: Tensor,
    noise: Tensor,
    *plan_tensors: Tensor | None,
    num_images: int,
) -> Tensor:
    """A whole GR00T chunk from processed inputs, as one capturable function: the backbone
    (:mod:`.backbone`), the action head's VL and state encoders, and :func:`euler_loop` from
    ``noise``. ``plan_tensors`` are :meth:`BackbonePlan.tensors`."""
    plan = BackbonePlan.from_tensors(list(plan_tensors), num_images)
    features = backbone.features(pixel_values, input_ids, plan)
    vl = head.vl_self_attention(head.vlln(features))
    state_features = head.state_encoder(state.view(state.shape[0], 1, -1), embodiment_id)
    return euler_loop(head, vl, state_features, embodiment_id, plan.image_mask, plan.attention_mask, noise)
