"""A ``FlowPolicy`` that acts with the RL rollout's stochastic sampler instead of the serving ODE.

Why: the correctness gate "SDE/Noise sampling of an SFT policy keeps success close to ODE sampling"
(notes checklist item 6) needs the same policy evaluated by the same eval runner with each sampler.
This wrapper swaps only the denoising call, so any difference in success is the sampler's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.policy import collate_observations
from cosmos_robot.policies.flow.sampling import SampleMode, sample_actions
from cosmos_robot.transforms import run_transforms

__all__ = ["SampledFlowPolicy"]


class SampledFlowPolicy(FlowPolicy):
    """``FlowPolicy`` whose chunks come from ``mode`` (``ode`` from fresh noise, ``flow_sde``, ``flow_noise``)."""

    def __init__(
        self,
        base: FlowPolicy,
        mode: SampleMode,
        seed: int = 0,
        num_steps: int | None = None,
        noise_level: float | None = None,
    ) -> None:
        super().__init__(base.model, base.stats, base.input_transforms, base.output_transforms)
        self.mode: SampleMode = mode
        self.num_steps = num_steps
        self.noise_level = noise_level
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def metadata(self) -> dict[str, Any]:
        return {**super().metadata, "sample_mode": self.mode}

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if not obs_batch:
            return []
        items = []
        for i, obs in enumerate(obs_batch):
            self._check_keys(obs, i)
            items.append(run_transforms(self.input_transforms, dict(obs)))
        with torch.inference_mode():
            batch = collate_observations(items, self.config, self.device)
            context = self.model.encode(batch)
            result = sample_actions(
                self.model,
                context,
                self.mode,
                num_steps=self.num_steps,
                generator=self.generator,
                noise_level=self.noise_level,
            )
            actions = result.actions.float().cpu().numpy()
        return [
            {"actions": np.asarray(run_transforms(self.output_transforms, {"actions": a})["actions"], dtype=np.float32)}
            for a in actions
        ]
