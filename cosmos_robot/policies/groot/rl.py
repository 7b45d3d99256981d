"""What online RL needs from GR00T N1.7: its flow action head behind the shared samplers, a value head.

GR00T's action head (LeRobot's ``GR00TN17ActionHead``) is a flow-matching DiT: the VLM backbone's
features (after ``vlln`` and the VL self-attention) are the cross-attention context, the state
encoder's token and the encoded noisy chunk are the sequence, and the action decoder returns the
velocity. Its conventions are the mirror image of ours: time runs from 0 (noise) to 1 (actions),
``x_t = (1 - t) noise + t actions``, the velocity is ``actions - noise`` and the time is bucketed
(``int(t * 1000)``). ``Gr00tRLModel.expert`` maps them: ``t_groot = 1 - t``, ``v = -v_groot``, so
the shared Flow-SDE sampler and its log-probs apply unchanged and an ODE step equals GR00T's own
Euler step (a test checks the ODE chunk against ``get_action``).

- ``encode(batch)``: the stored raw observations (uint8 cameras, state, task) through LeRobot's
  GR00T preprocessor (deterministic at inference) and the backbone, once per decision batch;
- ``value(context)``: GR00T has no critic; "per its design" the observation lives in the processed
  VL features, so the value head mean-pools them over the attention mask (two layers);
- ``freeze_vlm``: the Qwen3-VL backbone is frozen and run without gradients; the VL adapter, the
  DiT, the state/action encoders and decoder, and the value head train;
- dropout is off in training mode too (GR00T's DiT has dropout 0.2): PPO's ratio must start at 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from cosmos_robot.policies.groot.fast import dit_velocity
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.interfaces import ModelInputs, RLAdapter, RLModel
from cosmos_robot.policies.rl_heads import VLA_NOISE_LEVEL, FlowSpec, VLARLModel, masked_mean, value_head
from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["Gr00tContext", "Gr00tRLAdapter", "Gr00tRLModel"]


@dataclass
class Gr00tContext:
    backbone_output: Any  # BatchFeature with processed backbone_features, masks
    state_features: Tensor
    embodiment_id: Tensor

    @property
    def shape(self) -> tuple[int]:
        return (int(self.state_features.shape[0]),)

    @property
    def device(self) -> torch.device:
        return self.state_features.device

    def repeat_interleave(self, repeats: int, dim: int = 0) -> Gr00tContext:
        raise ValueError("GR00T has no learned noise head: Flow-Noise is not available (use flow_sde)")


class Gr00tRLModel(VLARLModel):
    """LeRobot's ``GR00TN17`` plus a value head, behind the flow samplers' interface."""

    family = "GR00T"

    def __init__(
        self,
        lerobot_policy: Any,
        preprocessor: Any,
        action_dims: int,
        noise_level: float = 0.5,
        freeze_vlm: bool = False,
        value_seed: int = 0,
    ) -> None:
        super().__init__()
        self.groot = lerobot_policy._groot_model  # the nn.Module; LeRobot's wrapper stays outside
        self._policy = [lerobot_policy]  # not a submodule: its parameters are self.groot's
        self._preprocessor = preprocessor
        self.camera_keys = [k for k, f in lerobot_policy.config.input_features.items() if "images" in k]
        head = self.groot.action_head
        self.action_dims = action_dims
        self.freeze_vlm = freeze_vlm
        self.config = FlowSpec(
            chunk_size=int(head.action_horizon),  # GR00T calls the chunk rows action_horizon
            action_dim=int(head.action_dim),
            num_flow_steps=int(head.num_inference_timesteps),
            noise_level=noise_level,
        )
        width = int(self.groot.config.backbone_embedding_dim)
        self.value_head = value_head(width, value_seed)
        self.value_head.to(next(self.groot.parameters()).device)
        if freeze_vlm:
            for p in self.groot.backbone.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True) -> Gr00tRLModel:
        super().train(mode)
        for m in self.modules():  # no dropout anywhere: rollout and learner must compute the same function
            if isinstance(m, nn.Dropout):
                m.eval()
        if mode:
            self.groot.backbone.set_frozen_modules_to_eval_mode()
        return self

    # --- the flow-sampler interface ------------------------------------------------------------------
    def encode(self, batch: Mapping[str, Any]) -> Gr00tContext:
        """``batch``: ``images`` uint8 (B, cams, 3, H, W) in ``camera_keys`` order, ``observation.state``, ``task``."""
        raw = {k: v for k, v in batch.items() if k != "images"}
        images = batch["images"]
        for c, key in enumerate(self.camera_keys):
            raw[key] = images[:, c].float() / 255.0
        processed = self._preprocessor(raw)
        inputs = self._policy[0]._filter_groot_inputs(processed, include_action=False)
        backbone_inputs, action_inputs = self.groot.prepare_input(inputs)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_vlm):
            backbone_output = self.groot.backbone(backbone_inputs)
        features = self.groot.action_head._encode_features(backbone_output, action_inputs)
        backbone_output["backbone_features"] = features.backbone_features
        return Gr00tContext(backbone_output, features.state_features, action_inputs.embodiment_id)

    def expert(self, x: Tensor, t: Tensor, context: Gr00tContext) -> tuple[Tensor, None]:
        head = self.groot.action_head
        t_groot = 1.0 - t.float()
        n = head.num_timestep_buckets
        buckets = torch.floor(t_groot * n + 1e-3).long().clamp(0, n - 1)
        out = context.backbone_output
        pred = dit_velocity(
            head,
            x.to(context.state_features.dtype),
            buckets,
            out.backbone_features,
            context.state_features,
            context.embodiment_id,
            out.get("image_mask"),
            out.get("backbone_attention_mask"),
        )
        return -pred.float(), None

    def velocity(self, x_t: Tensor, t: Tensor | float, context: Gr00tContext) -> Tensor:
        tt = t if isinstance(t, Tensor) else torch.full((x_t.shape[0],), float(t), device=x_t.device)
        return self.expert(x_t, tt, context)[0]

    def value(self, context: Gr00tContext, detach: bool = False) -> Tensor:
        feats = context.backbone_output.backbone_features
        mask = context.backbone_output.backbone_attention_mask
        if mask is None:
            mask = torch.ones(feats.shape[:2], device=feats.device)
        pooled = masked_mean(feats, mask)
        if detach:
            pooled = pooled.detach()
        return self.value_head(pooled.float()).squeeze(-1)


class Gr00tRLAdapter(RLAdapter):
    """A LeRobot GR00T N1.7 folder made trainable: ``Gr00tRLModel`` (value head; optional frozen backbone)."""

    model: Gr00tRLModel

    def __init__(self, policy: BatchPolicy, *, noise_level: float | None = None, freeze_vlm: bool = False) -> None:
        self.policy = self.expect(policy, Gr00tPolicy)
        self.action_dims = self.policy.action_dim
        self.model = Gr00tRLModel(
            self.policy.policy,
            self.policy.preprocessor,
            self.policy.action_dim,
            VLA_NOISE_LEVEL if noise_level is None else noise_level,
            freeze_vlm,
        )

    @staticmethod
    def load_policy(path: str, device: torch.device | str) -> BatchPolicy:
        return Gr00tPolicy.from_pretrained(path, device=device)

    def model_inputs(self, wire: Sequence[Mapping[str, Any]]) -> ModelInputs:
        raw = self.policy.io.batch([dict(w) for w in wire])  # LeRobot keys; cameras float in [0, 1] from uint8
        cams = [(raw.pop(k) * 255.0).round().to(torch.uint8) for k in self.model.camera_keys]
        return {"images": torch.stack(cams, dim=1), **raw}

    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        steps = int(self.policy.policy.config.n_action_steps)
        acts = chunks[:, :steps, : self.action_dims].to(next(self.model.parameters()).dtype)
        with torch.no_grad():
            out = self.policy.postprocessor(acts)
        return np.asarray(out.float().cpu().numpy(), dtype=np.float32)

    def servable(self, model: RLModel) -> BatchPolicy:
        if not isinstance(model, Gr00tRLModel):
            raise TypeError(f"Gr00tRLAdapter.servable: expected a Gr00tRLModel, got {type(model).__name__}")
        return Gr00tPolicy(model._policy[0], self.policy.preprocessor, self.policy.postprocessor)

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.model.groot.action_head.num_inference_timesteps = steps
