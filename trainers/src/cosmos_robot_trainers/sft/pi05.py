"""SFT of a pi0.5 checkpoint (LeRobot folder) on a LeRobotDataset, inside the same SFT loop as ``flow``.

What differs from the flow family, and how it is handled here:

- the model comes from ``init`` (a pi05 folder: released, converted or ``pi05_tiny``), not from a
  ``[model]`` table; ``Pi05SFTModel`` wraps it with the loop's ``flow_loss(batch, noise, time)``;
- normalisation and prompts are LeRobot's: the dataset's stats (mean/std/min/max/q01/q99) become
  the new processors' stats (as LeRobot does when fine-tuning), and every frame goes once through
  LeRobot's own preprocessor (quantile normalisation of state and actions, the discretised state
  written into the prompt, tokenisation), so training sees exactly what serving will feed;
- cameras are loaded at the vision size and kept uint8 in memory; actions are padded to
  ``max_action_dim``, and the loss covers only real action dims and steps inside the episode.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cosmos_robot.data.loader import first_episodes_per_task
from cosmos_robot.normalize import FeatureStats
from cosmos_robot.policies.pi05.modeling import Pi05Model
from cosmos_robot.policies.pi05.policy import Pi05Policy, build_processors
from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot.policies.rl_heads import openpi_flow_time
from cosmos_robot_trainers.common.export import EMA
from cosmos_robot_trainers.sft.adapter import SFTData, refuse_finetune
from cosmos_robot_trainers.sft.config import AugmentConfig, DataConfig, SFTConfig
from cosmos_robot_trainers.sft.data import FrameSet, augment_images
from cosmos_robot_trainers.sft.optim import default_param_groups

__all__ = ["Pi05SFTAdapter", "Pi05SFTModel", "Pi05TrainData", "build_pi05_policy", "load_pi05_train_data"]

ENV_CAMERAS = ("image", "wrist_image")  # recorded tabletop cameras, in the order of the checkpoint's features


class Pi05SFTModel(nn.Module):
    """``Pi05Model`` with the SFT loop's ``flow_loss(batch, noise, time)`` and ``sample_time``."""

    def __init__(self, pi05: Pi05Model, action_dim: int) -> None:
        super().__init__()
        self.pi05 = pi05
        self.action_dim = action_dim

    def sample_time(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return openpi_flow_time(n, generator)

    def flow_loss(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        images = batch["images"]
        dtype = self.pi05.action_in_proj.weight.dtype
        cams = [(images[:, c].float() / 127.5 - 1.0).to(dtype) for c in range(images.shape[1])]
        masks = [torch.ones(images.shape[0], dtype=torch.bool, device=images.device) for _ in cams]
        per = self.pi05.flow_loss(
            cams, masks, batch["tokens"], batch["token_mask"], batch["actions"], noise, time
        )  # (B, chunk, max_action_dim)
        keep = (~batch["action_pad_mask"]).float()[:, :, None]
        per = per[:, :, : self.action_dim] * keep
        loss = per.sum() / (keep.sum() * self.action_dim).clamp_min(1.0)
        return loss, {}


@dataclass
class Pi05TrainData(FrameSet):
    """Frames as pi05 sees them: uint8 cameras at the vision size, prompt tokens, normalised chunks."""

    images: torch.Tensor  # (N, cams, 3, S, S) uint8
    tokens: torch.Tensor  # (N, L) int64 (state + instruction prompt, LeRobot's tokeniser step)
    token_mask: torch.Tensor  # (N, L) bool
    actions: torch.Tensor  # (N, chunk, max_action_dim) float32, quantile-normalised, zero-padded dims
    pad_mask: torch.Tensor  # (N, chunk) bool, True past the episode's end
    prompts: list[str]
    stats: dict[str, FeatureStats]  # {"state", "actions"} in env units (the new processors' stats)
    num_episodes: int

    def content_sums(self) -> dict[str, Any]:
        return {"tokens_sum": int(self.tokens.sum())}

    def batch(
        self, indices: np.ndarray, augment: AugmentConfig | None, generator: torch.Generator, text_buckets: int = 0
    ) -> dict[str, Any]:
        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        images = self.images[idx]
        if augment is not None:
            images = augment_images(images, augment, generator)
        return {
            "images": images,
            "tokens": self.tokens[idx],
            "token_mask": self.token_mask[idx],
            "actions": self.actions[idx],
            "action_pad_mask": self.pad_mask[idx],
        }


def lerobot_stats(stats: dict[str, FeatureStats]) -> dict[str, dict[str, Any]]:
    return {"observation.state": stats["state"].to_dict(), "action": stats["actions"].to_dict()}


def load_pi05_train_data(cfg: DataConfig, policy: Pi05Policy, preprocess_rows: int = 512) -> Pi05TrainData:
    """Load ``cfg.root`` for ``policy``'s cameras, chunk size and vision size; run LeRobot's preprocessor once
    (``preprocess_rows`` frames at a time)."""
    from cosmos_robot.data.loader import compute_norm_stats, load_demonstrations
    from cosmos_robot.data.schema import ACTION, STATE

    arch = policy.arch
    cams = ENV_CAMERAS[: len(policy.camera_keys)]
    if len(cams) != len(policy.camera_keys):
        raise ValueError(f"the checkpoint has {len(policy.camera_keys)} cameras; the tabletop data have {ENV_CAMERAS}")
    size = arch.vision.image_size
    demo = load_demonstrations(cfg.root, chunk_size=arch.chunk_size, image_size=size, cameras=cams)
    keep = first_episodes_per_task(demo.episode_index.numpy(), demo.prompts, cfg.max_episodes_per_task)
    if keep is not None:
        demo.images, demo.state, demo.actions = demo.images[keep], demo.state[keep], demo.actions[keep]
        demo.action_is_pad, demo.episode_index = demo.action_is_pad[keep], demo.episode_index[keep]
        demo.prompts = [demo.prompts[i] for i in keep.tolist()]
    if demo.state.shape[1] != policy.state_dim or demo.actions.shape[2] != policy.action_dim:
        raise ValueError(
            f"data {cfg.root}: state {demo.state.shape[1]}-D / actions {demo.actions.shape[2]}-D, but the checkpoint "
            f"expects state {policy.state_dim}-D / actions {policy.action_dim}-D"
        )
    raw = compute_norm_stats(demo)
    stats = {"state": raw[STATE], "actions": raw[ACTION]}
    pre, _ = build_processors(policy.lerobot_config, lerobot_stats(stats), policy.tokenizer)
    tokens, masks, actions = [], [], []
    for start in range(0, demo.state.shape[0], preprocess_rows):
        sl = slice(start, start + preprocess_rows)
        out = pre(
            {
                "observation.state": demo.state[sl].float(),
                "action": demo.actions[sl].float(),
                "task": list(demo.prompts[sl]),
            }
        )
        tokens.append(out["observation.language.tokens"].cpu())
        masks.append(out["observation.language.attention_mask"].cpu().bool())
        actions.append(out["action"].cpu().float())
    acts = torch.cat(actions)
    padded = torch.zeros((acts.shape[0], arch.chunk_size, arch.max_action_dim))
    padded[:, :, : acts.shape[2]] = acts
    pad = demo.action_is_pad.bool()
    padded[pad] = 0.0
    return Pi05TrainData(
        images=demo.images.contiguous(),
        tokens=torch.cat(tokens),
        token_mask=torch.cat(masks),
        actions=padded,
        pad_mask=pad,
        prompts=list(demo.prompts),
        stats=stats,
        num_episodes=demo.num_episodes,
    )


def build_pi05_policy(
    model: Pi05SFTModel, base: Pi05Policy, stats: dict[str, FeatureStats], ema: Any = None
) -> Pi05Policy:
    """A servable ``Pi05Policy`` over a copy of the weights (EMA when given) with the data's stats."""
    served = copy.deepcopy(model)
    if ema is not None:
        ema.copy_to(served)
    policy = Pi05Policy.from_model(served.pi05.eval(), base.lerobot_config, lerobot_stats(stats), base.tokenizer)
    policy.num_steps = base.num_steps
    return policy


class Pi05SFTAdapter:
    """``SFTAdapter`` of the pi05 family: fine-tune the ``init`` folder (see the module docstring)."""

    supports_fsdp = True  # fresh_model reloads the init folder: a whole copy for export beside the shards

    def __init__(self) -> None:
        self.base: Pi05Policy | None = None
        self.init: Path | None = None

    def load_base(self, config: SFTConfig, init: Path | None) -> None:
        refuse_finetune(config, "pi05")
        if init is None:
            raise CheckpointError("init: pi05 SFT fine-tunes a pi05 checkpoint folder; set init")
        self.base = Pi05Policy.from_pretrained(init, device=config.train.device, cuda_graphs=False)
        self.init = Path(init)

    def fresh_model(self, config: SFTConfig, device: torch.device) -> nn.Module:
        """A model of its own (not over the base's modules, which FSDP shards): the init folder loaded again."""
        if self.init is None:
            raise RuntimeError("Pi05SFTAdapter: load_base was not called")
        policy = Pi05Policy.from_pretrained(self.init, device=str(device), cuda_graphs=False)
        return Pi05SFTModel(policy.model, policy.action_dim).to(device)

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """The model's FSDP units (``Pi05Model.fsdp_units``); the rest stays in the root unit."""
        return _pi05(model).pi05.fsdp_units()

    def _base(self) -> Pi05Policy:
        if self.base is None:
            raise RuntimeError("Pi05SFTAdapter: load_base was not called")
        return self.base

    def load_data(self, config: SFTConfig) -> SFTData:
        return load_pi05_train_data(config.data, self._base())

    def build_model(self, config: SFTConfig, device: torch.device) -> nn.Module:
        base = self._base()
        return Pi05SFTModel(base.model, base.action_dim).to(device)

    def flow_loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        return _pi05(model).flow_loss(batch, noise, time)[0]

    def param_groups(self, model: nn.Module, config: SFTConfig) -> list[dict[str, Any]]:
        return default_param_groups(model, config.optim)

    def sample_time(self, model: nn.Module, n: int, generator: torch.Generator) -> torch.Tensor:
        return _pi05(model).sample_time(n, generator)

    def servable(self, model: nn.Module, data: SFTData, ema: EMA | None) -> Pi05Policy:
        if not isinstance(data, Pi05TrainData):
            raise TypeError(f"Pi05SFTAdapter.servable: expected Pi05TrainData, got {type(data).__name__}")
        return build_pi05_policy(_pi05(model), self._base(), data.stats, ema)


def _pi05(model: nn.Module) -> Pi05SFTModel:
    if not isinstance(model, Pi05SFTModel):
        raise TypeError(f"Pi05SFTAdapter: expected a Pi05SFTModel, got {type(model).__name__}")
    return model
