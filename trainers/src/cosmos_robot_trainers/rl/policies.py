"""The policy families the RL trainer post-trains, behind one small interface.

What the driver loop needs from a family, and nothing else:

- ``model``: an ``nn.Module`` the shared flow samplers and the learner drive (``encode``, ``expert``,
  ``value``, ``velocity``, ``sample_time``, ``config.horizon / action_dim / num_flow_steps /
  noise_level``, critic parameters under ``value_head.``);
- ``model_inputs(wire_obs)``: the tensors stored with each decision, from openpi-style wire
  observations (``observation/<camera>``, ``observation/state``, ``prompt``); the rollout and the
  learner both encode exactly these, so the first-minibatch ratio is 1;
- ``env_actions(chunks)``: model-space chunks -> env units;
- ``servable(model)``: a serving ``BatchPolicy`` with those weights (evaluations, the ``final/`` folder).

``flow`` is our own checkpoint; ``pi05`` is a LeRobot pi0.5 folder (``cosmos_robot.policies.pi05``).
``load_rl_policy`` detects the family like ``serve --ckpt`` does.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cosmos_robot.policies import CheckpointError, detect_family
from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.policy import collate_observations
from cosmos_robot.transforms import run_transforms
from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["FlowRLPolicy", "Gr00tRLPolicy", "Pi05RLPolicy", "RLModel", "RLPolicy", "frozen_copy", "load_rl_policy"]

# The model an RLPolicy exposes: ``FlowModel`` or ``Pi05RLModel``, used through the methods listed in
# the module docstring (duck-typed: the two share no base class beyond ``nn.Module``).
RLModel = Any


class RLPolicy(abc.ABC):
    """One family's adapter (see the module docstring)."""

    model: RLModel
    action_dims: int  # executed action dims (log-probs cover these, never padding)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @abc.abstractmethod
    def model_inputs(self, wire: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Tensors (first dim = len(wire)) or lists to store per decision and to ``model.encode``."""

    @abc.abstractmethod
    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        """(B, H, D) model-space chunks -> (B, >= H rows, env action dims) float32 env units."""

    @abc.abstractmethod
    def servable(self, model: RLModel) -> BatchPolicy:
        """A serving policy that owns ``model`` (a copy the caller made)."""

    def set_num_flow_steps(self, steps: int) -> None:
        self.model.config = self.model.config.model_copy(update={"num_flow_steps": steps})


class FlowRLPolicy(RLPolicy):
    """Our ``flow`` family: the model is the ``FlowModel`` itself."""

    def __init__(self, policy: FlowPolicy) -> None:
        self.policy = policy
        self.model = policy.model
        self.action_dims = policy.config.action_dim

    def model_inputs(self, wire: Sequence[dict[str, Any]]) -> dict[str, Any]:
        items = [run_transforms(self.policy.input_transforms, dict(w)) for w in wire]
        batch = collate_observations(items, self.policy.config, self.device)
        batch["prompt"] = [str(item["prompt"]) for item in items]
        return {"images": batch["images"], "state": batch["state"], "prompt": batch["prompt"]}

    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        acts = chunks.float().cpu().numpy()
        return np.stack([run_transforms(self.policy.output_transforms, {"actions": a})["actions"] for a in acts])

    def servable(self, model: RLModel) -> BatchPolicy:
        p = self.policy
        return FlowPolicy(model.eval(), p.stats, p.input_transforms, p.output_transforms)

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.policy.config = self.model.config


class Pi05RLPolicy(RLPolicy):
    """A LeRobot pi0.5 folder: the model is ``Pi05RLModel`` (value head; optional frozen VLM)."""

    def __init__(self, policy: Any, noise_level: float = 0.5, freeze_vlm: bool = False) -> None:
        from cosmos_robot.policies.pi05.rl import Pi05RLModel

        self.policy = policy
        self.action_dims = policy.action_dim
        self.model = Pi05RLModel(policy.model, policy.action_dim, policy.num_steps, noise_level, freeze_vlm)

    def model_inputs(self, wire: Sequence[dict[str, Any]]) -> dict[str, Any]:
        inputs = self.policy.prepare(wire)  # LeRobot's preprocessor: normalised state in the prompt, tokens
        images = torch.stack([((img.float() + 1.0) * 127.5).round().clamp(0, 255) for img in inputs.images], dim=1)
        return {"images": images.to(torch.uint8), "tokens": inputs.tokens, "token_mask": inputs.token_mask}

    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        return self.policy.unnormalize(chunks)

    def servable(self, model: RLModel) -> BatchPolicy:
        from cosmos_robot.policies.pi05.policy import Pi05Policy

        p = self.policy
        served = Pi05Policy(model.pi05.eval(), p.lerobot_config, p.preprocessor, p.postprocessor, p.tokenizer)
        served.num_steps = int(model.config.num_flow_steps)
        return served

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.policy.num_steps = steps


class Gr00tRLPolicy(RLPolicy):
    """A LeRobot GR00T N1.7 folder: the model is ``Gr00tRLModel`` (value head; optional frozen backbone)."""

    def __init__(self, policy: Any, noise_level: float = 0.5, freeze_vlm: bool = False) -> None:
        from cosmos_robot.policies.groot.rl import Gr00tRLModel

        self.policy = policy
        self.action_dims = policy.action_dim
        self.model = Gr00tRLModel(policy.policy, policy.preprocessor, policy.action_dim, noise_level, freeze_vlm)

    def model_inputs(self, wire: Sequence[dict[str, Any]]) -> dict[str, Any]:
        raw = self.policy.io.batch(wire)  # LeRobot keys; cameras float in [0, 1] from uint8
        cams = [(raw.pop(k) * 255.0).round().to(torch.uint8) for k in self.model.camera_keys]
        return {"images": torch.stack(cams, dim=1), **raw}

    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        steps = int(self.policy.policy.config.n_action_steps)
        acts = chunks[:, :steps, : self.action_dims].to(next(self.model.parameters()).dtype)
        with torch.no_grad():
            out = self.policy.postprocessor(acts)
        return np.asarray(out.float().cpu().numpy(), dtype=np.float32)

    def servable(self, model: RLModel) -> BatchPolicy:
        from cosmos_robot.policies.groot.policy import Gr00tPolicy

        return Gr00tPolicy(model._policy[0], self.policy.preprocessor, self.policy.postprocessor)

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.model.groot.action_head.num_inference_timesteps = steps


def load_rl_policy(
    path: str | Path, device: torch.device | str = "cpu", noise_level: float | None = None, freeze_vlm: bool = False
) -> RLPolicy:
    """The RL adapter for a checkpoint folder of any supported family."""
    family = detect_family(path)
    if family == "flow":
        if freeze_vlm:
            raise CheckpointError(f"{path}: freeze_vlm applies to pi05 checkpoints; this is a flow checkpoint")
        return FlowRLPolicy(FlowPolicy.from_pretrained(path, device=device))
    if family == "pi05":
        from cosmos_robot.policies.pi05.policy import Pi05Policy

        policy = Pi05Policy.from_pretrained(path, device=device, cuda_graphs=False)
        return Pi05RLPolicy(policy, 0.5 if noise_level is None else noise_level, freeze_vlm)
    if family == "groot":
        from cosmos_robot.policies.groot.policy import Gr00tPolicy

        groot = Gr00tPolicy.from_pretrained(path, device=device)
        return Gr00tRLPolicy(groot, 0.5 if noise_level is None else noise_level, freeze_vlm)
    raise CheckpointError(f"{path}: the RL trainer supports flow, pi05 and groot checkpoints, not {family!r}")


def frozen_copy(model: nn.Module) -> nn.Module:
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen
