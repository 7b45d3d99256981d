"""A ``FlowPolicy`` that acts with the RL rollout's stochastic sampler instead of the serving ODE.

Why: the correctness gate "SDE/Noise sampling of an SFT policy keeps success close to ODE sampling"
(notes checklist item 6) needs the same policy evaluated by the same eval runner with each sampler.
This wrapper swaps only the denoising call, so any difference in success is the sampler's.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.sampling import SampleMode, sample_actions

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

    def denoise(self, context: torch.Tensor) -> torch.Tensor:
        return sample_actions(
            self.model,
            context,
            self.mode,
            num_steps=self.num_steps,
            generator=self.generator,
            noise_level=self.noise_level,
        ).actions
