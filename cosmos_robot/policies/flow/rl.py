"""The ``flow`` family's RL adapter: the ``FlowModel`` itself is the ``RLModel``.

Our own checkpoint carries its transforms and normalisation stats in ``policy.json``; the adapter
runs the same input transforms serving runs (so rollouts store exactly what serving would feed) and
the output transforms on sampled chunks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.flow.modeling_flow import FlowModel
from cosmos_robot.policies.flow.policy import FlowPolicy, collate_observations
from cosmos_robot.policies.interfaces import ModelInputs, RLAdapter, RLModel
from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot.transforms import run_transforms
from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["FlowRLAdapter"]


class FlowRLAdapter(RLAdapter):
    """Our ``flow`` checkpoint: the model is the ``FlowModel`` (it has the critic and noise heads)."""

    model: FlowModel

    def __init__(self, policy: BatchPolicy, *, noise_level: float | None = None, freeze_vlm: bool = False) -> None:
        if freeze_vlm:
            raise CheckpointError("freeze_vlm applies to VLA checkpoints (pi05, groot); this is a flow checkpoint")
        # the flow model keeps its config's noise level; rollouts read ``rollout.noise_level`` first
        self.policy = self.expect(policy, FlowPolicy)
        self.model = self.policy.model
        self.action_dims = self.policy.config.action_dim
        self.reads_images = bool(self.policy.config.cameras)
        self.reads_object_state = "object_state" in self.policy.config.state_keys

    @staticmethod
    def load_policy(path: str, device: torch.device | str) -> BatchPolicy:
        return FlowPolicy.from_pretrained(path, device=device)

    def model_inputs(self, wire: Sequence[Mapping[str, Any]]) -> ModelInputs:
        items = [run_transforms(self.policy.input_transforms, dict(w)) for w in wire]
        batch = collate_observations(items, self.policy.config, self.device)
        return {
            "images": batch["images"],
            "state": batch["state"],
            "prompt": [str(item.get("prompt", "")) for item in items],
        }

    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        acts = chunks.float().cpu().numpy()
        return np.stack([run_transforms(self.policy.output_transforms, {"actions": a})["actions"] for a in acts])

    def servable(self, model: RLModel) -> BatchPolicy:
        if not isinstance(model, FlowModel):
            raise TypeError(f"FlowRLAdapter.servable: expected a FlowModel, got {type(model).__name__}")
        p = self.policy
        return FlowPolicy(model.eval(), p.stats, p.input_transforms, p.output_transforms)

    def serving_noise(self, batch: int) -> torch.Tensor | None:
        return self.policy.serving_noise(batch)

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.policy.config = self.model.config
