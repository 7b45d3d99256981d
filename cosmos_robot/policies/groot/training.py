"""GR00T N1.7's action-head training loss with every random draw passed in (SFT with a frozen backbone).

Why not call LeRobot's ``GrootPolicy.forward``: it draws its state dropout, noise and flow time from
the global RNG in the middle of the forward, runs the backbone every step, and overwrites the
backbone's output in place (``process_backbone_output``), so neither a cached backbone feature nor a
trainer-owned generator (exact resume, the shared SFT loop's draw order) can be used with it. This is
the same computation, line for line (LeRobot 0.6.1, ``GR00TN17ActionHead.forward``):

- time: ``t = (1 - Beta(1.5, 1)) * 0.999`` (``noise_s``), drawn as LeRobot's ``Beta.sample`` draws it
  (a Dirichlet of the two concentrations, first coordinate), so the same generator state gives the
  same times bit for bit; bucketed ``int(t * 1000)``;
- ``x_t = (1 - t) noise + t actions``, target ``actions - noise``;
- state dropout: the encoded state token is zeroed for a sample with probability
  ``state_dropout_prob`` (training only; the draw happens before the noise, as in LeRobot);
- loss: squared error times the action mask, summed, divided by the mask's sum (+1e-6).

With the draws in LeRobot's order (state dropout, noise, time) from a generator seeded like LeRobot's
global one, the loss equals ``GrootPolicy.forward``'s (``tests/trainers/test_sft_groot.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cosmos_robot.policies.groot.fast import dit_velocity

__all__ = ["backbone_features", "draw_state_dropout", "groot_flow_loss", "sample_groot_time"]


def sample_groot_time(n: int, generator: torch.Generator | None, head: Any) -> Tensor:
    """(n,) flow times ``(1 - Beta(alpha, beta)) * noise_s`` of ``head``'s config, from ``generator``.

    ``torch.distributions.Beta.sample`` is ``Dirichlet([alpha, beta]).sample()[..., 0]``, which is
    ``torch._sample_dirichlet``; calling that with a generator gives LeRobot's draw for the same state.
    """
    alpha, beta = float(head._noise_beta_alpha), float(head._noise_beta_beta)
    concentration = torch.tensor([alpha, beta], dtype=torch.float32).expand(n, 2)
    sample = torch._sample_dirichlet(concentration, generator=generator)[:, 0]
    return (1.0 - sample) * float(head.config.noise_s)


def draw_state_dropout(n: int, probability: float, generator: torch.Generator | None) -> Tensor:
    """(n,) bool, True where the state token is dropped; all False (and no draw) when the probability is 0."""
    if probability <= 0:
        return torch.zeros(n, dtype=torch.bool)
    return torch.rand(n, generator=generator) < probability


def backbone_features(groot: Any, backbone_inputs: Mapping[str, Any]) -> dict[str, Tensor]:
    """The frozen backbone's output for prepared inputs (``GR00TN17.prepare_input``), without gradients:
    ``backbone_features`` (B, S, H), ``backbone_attention_mask`` and ``image_mask`` (B, S) bool."""
    with torch.no_grad():
        out = groot.backbone(backbone_inputs)
    return {k: out[k] for k in ("backbone_features", "backbone_attention_mask", "image_mask")}


def groot_flow_loss(
    head: Any,
    features: Mapping[str, Tensor],
    state: Tensor,
    actions: Tensor,
    action_mask: Tensor,
    embodiment_id: Tensor,
    noise: Tensor,
    time: Tensor,
    state_drop: Tensor | None,
) -> Tensor:
    """GR00T's masked flow-matching loss of ``head`` (LeRobot's ``GR00TN17ActionHead``).

    ``features``: the backbone's output (``backbone_features``, ``backbone_attention_mask``,
    ``image_mask``), never modified; ``state`` (B, 1 or D); ``actions``/``action_mask`` (B, T, D) from
    LeRobot's preprocessor; ``noise`` like ``actions``; ``time`` (B,) from :func:`sample_groot_time`;
    ``state_drop`` (B,) bool or None, applied in training mode only (as LeRobot's)."""
    head.set_frozen_modules_to_eval_mode()
    vl = head.vl_self_attention(head.vlln(features["backbone_features"]))
    state_features = head.state_encoder(state.reshape(state.shape[0], 1, -1), embodiment_id)
    if head.training and state_drop is not None and bool(state_drop.any()):  # LeRobot: training only
        state_features = state_features * (
            1 - state_drop.to(state_features.device)[:, None, None].to(state_features.dtype)
        )
    t = time.to(actions.dtype)[:, None, None]
    x_t = (1 - t) * noise + t * actions
    target = actions - noise
    buckets = (t[:, 0, 0] * head.num_timestep_buckets).long()
    pred = dit_velocity(
        head,
        x_t,
        buckets,
        vl,
        state_features,
        embodiment_id,
        features.get("image_mask"),
        features.get("backbone_attention_mask"),
    )
    loss = F.mse_loss(pred, target, reduction="none") * action_mask
    return loss.sum() / (action_mask.sum() + 1e-6)
