"""What an update (or health) phase may use beyond the rollout: the run's models, optimizer and
sampler settings and this iteration's generator. Its own module so that the algorithm modules
(``learner.py``, ``regression.py``) and their table (``methods.py``) can all take it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cosmos_robot.distributed import World
from cosmos_robot.policies.flow.sampling import SampleMode
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.policies import RLModel

__all__ = ["AuxLoss", "UpdateInputs"]

# a loss every optimizer step adds once (beside the algorithm's minibatch loss): ``aux(model) -> (loss, metrics)``
AuxLoss = Callable[[RLModel], tuple[torch.Tensor, dict[str, Any]]]


@dataclass
class UpdateInputs:
    """What an update phase may use beyond the rollout and its advantages."""

    model: RLModel
    optimizer: torch.optim.Optimizer
    config: RLConfig
    generator: torch.Generator
    iteration: int
    sample_mode: SampleMode
    k_steps: int  # denoising steps of the rollout sampler
    noise_level: float
    ref_model: RLModel | None = None
    old_model: RLModel | None = None
    world: World = field(default_factory=World)  # the data-parallel learner ranks (a world of one by default)
    aux: AuxLoss | None = None  # this iteration's demonstration loss (``[bc]``, ``rl/demos.py``), if any
