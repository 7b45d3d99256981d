"""What online RL needs from pi0.5: stochastic sampling with log-probs, a value head, a frozen backbone.

``Pi05RLModel`` presents a pi0.5 model through the interface the shared flow samplers
(``cosmos_robot.policies.flow.sampling``) and the RL learner use for every flow family:

- ``encode(batch)`` -> a ``Pi05Context`` (the prefix KV cache) from stored model inputs
  (``images`` uint8 (B, cams, 3, S, S) already resized like serving, ``tokens``, ``token_mask``), so
  a rollout and the learner encode byte-identical inputs and the PPO ratio starts at exactly 1;
- ``expert(x_t, t, context)`` -> the action expert's velocity at per-sample flow times: Flow-SDE
  (one stochastic Euler step, the rest ODE) and its log-probs come from the shared sampler, over
  the executed rows and the real action dims only (``action_dims``), never the zero padding;
- ``value(context)``: a two-layer head on the VLM prefix, mean-pooled over its valid tokens (the
  prefix is what the observation is; the action expert only sees noise and time);
- ``freeze_vlm``: SigLIP + the Gemma VLM are frozen and run without gradients (the expert, the
  action projections and the value head train), which is what fits a 3 B-parameter policy's RL
  update on one GPU.

pi0.5 has no learned noise head, so Flow-Noise is refused with an error that says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from cosmos_robot.policies.interfaces import ModelInputs, RLAdapter, RLModel
from cosmos_robot.policies.pi05.modeling import Pi05Model, PrefixCache
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.rl_heads import VLA_NOISE_LEVEL, FlowSpec, VLARLModel, masked_mean, value_head
from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["Pi05Context", "Pi05RLAdapter", "Pi05RLModel"]


@dataclass
class Pi05Context:
    """The encoded observation batch the sampler passes back to ``expert`` (tensor-like where it must be)."""

    cache: PrefixCache

    @property
    def shape(self) -> tuple[int]:
        return (int(self.cache.pad_mask.shape[0]),)

    @property
    def device(self) -> torch.device:
        return self.cache.pad_mask.device

    def repeat_interleave(self, repeats: int, dim: int = 0) -> Pi05Context:
        if dim != 0:
            raise ValueError("Pi05Context repeats along the batch only")
        return Pi05Context(self.cache.expand(repeats))


class Pi05RLModel(VLARLModel):
    """A ``Pi05Model`` plus a value head, behind the flow samplers' interface (see the module doc)."""

    family = "pi05"

    def __init__(
        self,
        pi05: Pi05Model,
        action_dims: int,
        num_flow_steps: int,
        noise_level: float = 0.5,
        freeze_vlm: bool = False,
        value_seed: int = 0,
    ) -> None:
        super().__init__()
        arch = pi05.arch
        if not 1 <= action_dims <= arch.max_action_dim:
            raise ValueError(f"action_dims must be in [1, {arch.max_action_dim}], got {action_dims}")
        if pi05.fp8_layers():
            raise ValueError("pi05 RL needs a trainable model; this one was converted to FP8 (precision=fp8)")
        self.pi05 = pi05
        self.action_dims = action_dims
        self.freeze_vlm = freeze_vlm
        self.config = FlowSpec(
            chunk_size=arch.chunk_size,
            action_dim=arch.max_action_dim,
            num_flow_steps=num_flow_steps,
            noise_level=noise_level,
        )
        width = arch.vlm.width
        self.value_head = value_head(width, value_seed)
        dtype = pi05.action_in_proj.weight.dtype
        self.value_head.to(device=pi05.action_in_proj.weight.device, dtype=dtype)
        if freeze_vlm:
            for p in self.vlm_parameters():
                p.requires_grad_(False)

    def vlm_parameters(self) -> list[nn.Parameter]:
        """SigLIP, the projector and the Gemma VLM (what ``freeze_vlm`` freezes)."""
        return list(self.pi05.paligemma_with_expert.paligemma.parameters())

    # --- the flow-sampler interface ------------------------------------------------------------------
    def encode(self, batch: Mapping[str, Any]) -> Pi05Context:
        images = batch["images"]
        if images.dtype != torch.uint8 or images.dim() != 5:
            raise ValueError(f"images: expected uint8 (B, cams, 3, S, S), got {images.dtype} {tuple(images.shape)}")
        dtype = self.pi05.action_in_proj.weight.dtype
        cams = [(images[:, c].float() / 255.0 * 2.0 - 1.0).to(dtype) for c in range(images.shape[1])]
        masks = [torch.ones(images.shape[0], dtype=torch.bool, device=images.device) for _ in cams]
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_vlm):
            cache = self.pi05.encode_prefix(cams, masks, batch["tokens"], batch["token_mask"].bool())
        return Pi05Context(cache)

    def expert(self, x: Tensor, t: Tensor, context: Pi05Context) -> tuple[Tensor, None]:
        return self.pi05.velocity(context.cache, x, t).float(), None

    def velocity(self, x_t: Tensor, t: Tensor | float, context: Pi05Context) -> Tensor:
        tt = t if isinstance(t, Tensor) else torch.full((x_t.shape[0],), float(t), device=x_t.device)
        return self.pi05.velocity(context.cache, x_t, tt.float()).float()

    def value(self, context: Pi05Context, detach: bool = False) -> Tensor:
        hidden = context.cache.hidden
        if hidden is None:  # encode() keeps it; only generate()'s actions-only prefix drops it
            raise ValueError("the value head needs the prefix's pooled output: encode with hidden=True")
        pooled = masked_mean(hidden, context.cache.pad_mask)
        if detach:
            pooled = pooled.detach()
        return self.value_head(pooled.to(self.pi05.action_in_proj.weight.dtype)).squeeze(-1).float()


class Pi05RLAdapter(RLAdapter):
    """A LeRobot pi0.5 folder made trainable: the model is ``Pi05RLModel`` (value head; optional frozen VLM)."""

    model: Pi05RLModel

    def __init__(self, policy: BatchPolicy, *, noise_level: float | None = None, freeze_vlm: bool = False) -> None:
        self.policy = self.expect(policy, Pi05Policy)
        self.action_dims = self.policy.action_dim
        self.model = Pi05RLModel(
            self.policy.model,
            self.policy.action_dim,
            self.policy.num_steps,
            VLA_NOISE_LEVEL if noise_level is None else noise_level,
            freeze_vlm,
        )

    @staticmethod
    def load_policy(path: str, device: torch.device | str) -> BatchPolicy:
        return Pi05Policy.from_pretrained(path, device=device, cuda_graphs=False)

    def model_inputs(self, wire: Sequence[Mapping[str, Any]]) -> ModelInputs:
        inputs = self.policy.prepare([dict(w) for w in wire])  # LeRobot's preprocessor: state in the prompt, tokens
        images = torch.stack([((img.float() + 1.0) * 127.5).round().clamp(0, 255) for img in inputs.images], dim=1)
        return {"images": images.to(torch.uint8), "tokens": inputs.tokens, "token_mask": inputs.token_mask}

    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        return self.policy.unnormalize(chunks)

    def servable(self, model: RLModel) -> BatchPolicy:
        if not isinstance(model, Pi05RLModel):
            raise TypeError(f"Pi05RLAdapter.servable: expected a Pi05RLModel, got {type(model).__name__}")
        p = self.policy
        served = Pi05Policy(model.pi05.eval(), p.lerobot_config, p.preprocessor, p.postprocessor, p.tokenizer)
        served.num_steps = int(model.config.num_flow_steps)
        return served

    def fsdp_units(self, model: RLModel) -> list[nn.Module]:
        """The RL trainer's FSDP units (``train.fsdp``): the pi0.5 model's own (``Pi05Model.fsdp_units``)."""
        if not isinstance(model, Pi05RLModel):
            raise TypeError(f"Pi05RLAdapter.fsdp_units: expected a Pi05RLModel, got {type(model).__name__}")
        return model.pi05.fsdp_units()

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.policy.num_steps = steps
