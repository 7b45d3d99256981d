"""SFT of a GR00T N1.7 checkpoint's action head with the backbone frozen, inside the shared SFT loop.

What cosmos-framework and LeRobot call GR00T fine-tuning: the Qwen3-VL backbone stays frozen (LeRobot's
``tune_llm`` / ``tune_visual`` off), and the parts its ``tune_*`` flags name train with GR00T's
flow-matching loss (``cosmos_robot.policies.groot.training``): ``projector`` (state and action
encoders, action decoder, position embedding), ``diffusion_model`` (the DiT) and ``vlln`` (the VL
layer norm and self-attention). ``finetune.tune`` picks them (default: the checkpoint's own flags).

- **Data**: frames of a LeRobotDataset go once through LeRobot's GR00T preprocessor, built for the
  data (``finetune.embodiment``: the checkpoint's tag, whose statistics are kept, or a tag it has no
  statistics for, such as ``new_embodiment``, normalised with the data's: LeRobot's rule), giving
  state, action chunk, action mask and embodiment id per frame.
- **Feature cache**: with a frozen backbone and no image augmentation the backbone's output for a
  frame never changes, so it is computed once per frame (frames of one prompt together, at their
  natural length) and batches left-pad them to the batch's longest, as LeRobot's tokenizer pads
  (pad positions get the backbone's pad-token feature, the same vector wherever a pad sits: checked
  when the cache is built). ``finetune.feature_cache``: ``auto`` (cache unless ``[augment]`` changes
  images), ``on`` (refuse augmentation) or ``off`` (run LeRobot's preprocessor and the backbone on
  every batch: its exact batch). The cache lives in memory: 0.7 MB per frame at the released shapes.
- **Draw order**: the batch draws the state dropout last, then the loop draws noise and time from
  the same generator: LeRobot's order (rand, randn, Beta), so with LeRobot's seed the loss is its own.
- **Optimizer groups**: LeRobot's (no weight decay on biases and norms), not the flow family's rule.
- **Export**: ``final/`` is a LeRobot GR00T folder (the trained head in the checkpoint's model, the
  processors with the data's statistics under ``finetune.embodiment``); training checkpoints hold only
  the action head.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from cosmos_robot.data.loader import first_episodes_per_task
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.groot.training import (
    backbone_features,
    draw_state_dropout,
    groot_flow_loss,
    sample_groot_time,
)
from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot_trainers.common.export import EMA
from cosmos_robot_trainers.common.progress import TrainProgress
from cosmos_robot_trainers.sft.adapter import SFTData
from cosmos_robot_trainers.sft.config import AugmentConfig, SFTConfig
from cosmos_robot_trainers.sft.data import FrameSet

__all__ = [
    "FeatureCache",
    "Gr00tSFTAdapter",
    "Gr00tSFTModel",
    "Gr00tTrainData",
    "TUNE_PARTS",
    "build_feature_cache",
    "load_groot_demos",
    "preprocess_frames",
]

ENV_CAMERAS = ("image", "wrist_image")  # recorded cameras, in the order of the checkpoint's features
TUNE_PARTS = ("projector", "diffusion_model", "vlln")  # LeRobot's tune_projector / _diffusion_model / _vlln
FEATURE_KEYS = ("backbone_features", "backbone_attention_mask", "image_mask")


# --------------------------------------------------------------------------------------------------
# the cached backbone output
# --------------------------------------------------------------------------------------------------
@dataclass
class FeatureCache:
    """Per-frame backbone outputs at their natural length, grouped by sequence length."""

    groups: list[Tensor]  # per group: (frames, L_g, H) features
    image_masks: list[Tensor]  # per group: (L_g,) bool
    where: Tensor  # (N, 2) int64: (group, row) of each frame
    pad_row: Tensor | None  # (H,) the backbone's feature at a left-pad position (None: one length only)

    def gather(self, indices: Tensor) -> dict[str, Tensor]:
        """Left-padded (B, L, H) features and (B, L) masks for the frames ``indices`` (LeRobot's layout)."""
        groups, rows = self.where[indices, 0], self.where[indices, 1]
        longest = max(int(self.groups[int(g)].shape[1]) for g in groups)
        feats, attn, image = [], [], []
        for g, r in zip(groups.tolist(), rows.tolist(), strict=True):
            f = self.groups[g][r]
            pad = longest - f.shape[0]
            if pad and self.pad_row is None:
                raise RuntimeError("FeatureCache: frames of different lengths but no pad feature")
            fill = self.pad_row if pad else None
            feats.append(f if fill is None else torch.cat([fill.to(f.dtype).expand(pad, -1), f]))
            mask = torch.ones(f.shape[0], dtype=torch.bool)
            attn.append(torch.cat([torch.zeros(pad, dtype=torch.bool), mask]))
            image.append(torch.cat([torch.zeros(pad, dtype=torch.bool), self.image_masks[g]]))
        return {
            "backbone_features": torch.stack(feats),
            "backbone_attention_mask": torch.stack(attn),
            "image_mask": torch.stack(image),
        }


# --------------------------------------------------------------------------------------------------
# the data
# --------------------------------------------------------------------------------------------------
@dataclass
class Gr00tTrainData(FrameSet):
    """Frames as GR00T's action head sees them (LeRobot's preprocessor output) plus the raw frames."""

    images: Tensor  # (N, cams, 3, S, S) uint8 (the recompute path preprocesses them per batch)
    raw_state: Tensor  # (N, state_dim) float32, env units
    state: Tensor  # (N, 1, max_state_dim) normalised, padded
    actions: Tensor  # (N, T, max_action_dim) normalised, padded
    action_mask: Tensor  # (N, T, max_action_dim) float32
    embodiment_id: Tensor  # (N,) int
    prompts: list[str]
    stats: dict[str, dict[str, Any]]  # the processors' statistics (LeRobot keys), env units
    num_episodes: int
    state_dropout: float  # the head's state_dropout_prob (drawn per batch, training only)
    features: FeatureCache | None = None
    camera_keys: list[str] = field(default_factory=list)

    def content_sums(self) -> dict[str, Any]:
        return {"embodiment_sum": int(self.embodiment_id.sum()), "cached": self.features is not None}

    def batch(
        self, indices: np.ndarray, augment: AugmentConfig | None, generator: torch.Generator, text_buckets: int = 0
    ) -> dict[str, Any]:
        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        out: dict[str, Any] = {
            "state": self.state[idx],
            "actions": self.actions[idx],
            "action_mask": self.action_mask[idx],
            "embodiment_id": self.embodiment_id[idx],
            "frames": idx,
        }
        if self.features is not None:
            out.update(self.features.gather(idx))
        elif augment is not None and _changes_images(augment):
            from cosmos_robot_trainers.sft.data import augment_images

            out["images"] = augment_images(self.images[idx], augment, generator)
        # last: LeRobot draws the state dropout before the noise and the time (the loop draws those next)
        out["state_drop"] = draw_state_dropout(len(idx), self.state_dropout, generator)
        return out

    def loss_mass(self, batch: dict[str, Any]) -> float:
        """GR00T's loss divides the masked squared error by the mask's sum."""
        return float(batch["action_mask"].sum())

    def raw_batch(self, indices: Tensor, images: Tensor | None = None) -> dict[str, Any]:
        """LeRobot's raw observation batch of ``indices`` (cameras float in [0, 1]), for its preprocessor."""
        imgs = self.images[indices] if images is None else images.cpu()
        raw: dict[str, Any] = {
            "observation.state": self.raw_state[indices],
            "task": [self.prompts[int(i)] for i in indices],
        }
        for c, key in enumerate(self.camera_keys):
            raw[key] = imgs[:, c].float() / 255.0
        return raw


def _changes_images(augment: AugmentConfig) -> bool:
    return bool(augment.random_shift or augment.brightness or augment.contrast)


def _dataset_image_size(root: Path, camera: str) -> int:
    info = json.loads((root / "meta" / "info.json").read_text())
    feature = info.get("features", {}).get(f"observation.images.{camera}")
    if feature is None:
        raise KeyError(f"data.root: {root} has no camera observation.images.{camera}")
    return int(max(feature["shape"][:2]))


def load_groot_demos(config: SFTConfig, base: Gr00tPolicy) -> Any:
    """``config.data.root`` for the checkpoint's cameras and action horizon, at the data's own image size."""
    from cosmos_robot.data.loader import load_demonstrations

    cfg = config.data
    head = base.policy._groot_model.action_head
    cams = ENV_CAMERAS[: len(base.io.camera_keys)]
    if len(cams) != len(base.io.camera_keys):
        raise ValueError(f"the checkpoint has {len(base.io.camera_keys)} cameras; the recorded data have {ENV_CAMERAS}")
    size = _dataset_image_size(Path(cfg.root), cams[0])
    demo = load_demonstrations(cfg.root, chunk_size=int(head.action_horizon), image_size=size, cameras=cams)
    keep = first_episodes_per_task(demo.episode_index.numpy(), demo.prompts, cfg.max_episodes_per_task)
    if keep is not None:
        demo.images, demo.state, demo.actions = demo.images[keep], demo.state[keep], demo.actions[keep]
        demo.action_is_pad, demo.episode_index = demo.action_is_pad[keep], demo.episode_index[keep]
        demo.prompts = [demo.prompts[i] for i in keep.tolist()]
    if demo.state.shape[1] != base.io.state_dim or demo.actions.shape[2] != base.action_dim:
        raise ValueError(
            f"data {cfg.root}: state {demo.state.shape[1]}-D / actions {demo.actions.shape[2]}-D, but the checkpoint "
            f"expects state {base.io.state_dim}-D / actions {base.action_dim}-D"
        )
    return demo


def preprocess_frames(
    demo: Any,
    base: Gr00tPolicy,
    pre: Any,
    stats: dict[str, Any],
    rows: int = 256,
    progress: Callable[[int], None] | None = None,
) -> Gr00tTrainData:
    """Every frame once through ``pre`` (LeRobot's GR00T preprocessor for the data); ``progress(frames
    done)`` after each block."""
    head = base.policy._groot_model.action_head
    data = Gr00tTrainData(
        prompts=list(demo.prompts),
        images=demo.images.contiguous(),
        raw_state=demo.state.float(),
        state=torch.empty(0),
        actions=torch.empty(0),
        action_mask=torch.empty(0),
        embodiment_id=torch.empty(0),
        stats=stats,
        num_episodes=demo.num_episodes,
        state_dropout=float(head.state_dropout_prob),
        camera_keys=list(base.io.camera_keys),
    )
    states, actions, masks, ids = [], [], [], []
    for start in range(0, len(data), rows):
        idx = torch.arange(start, min(start + rows, len(data)))
        raw = data.raw_batch(idx)
        raw["action"] = demo.actions[idx].float()
        raw["action_is_pad"] = demo.action_is_pad[idx].bool()
        out = pre(raw)
        states.append(out["state"].cpu().float())
        actions.append(out["action"].cpu().float())
        masks.append(out["action_mask"].cpu().float())
        ids.append(out["embodiment_id"].cpu())
        if progress is not None:
            progress(int(idx[-1]) + 1)
    data.state, data.actions = torch.cat(states), torch.cat(actions)
    data.action_mask, data.embodiment_id = torch.cat(masks), torch.cat(ids)
    return data


def _backbone_of(base: Gr00tPolicy, pre: Any, raw: dict[str, Any]) -> dict[str, Tensor]:
    """LeRobot's preprocessor and the frozen backbone on a raw observation batch (under GR00T's autocast)."""
    lerobot = base.policy
    processed = pre(raw)
    inputs = lerobot._filter_groot_inputs(processed, include_action=False)
    groot = lerobot._groot_model
    backbone_inputs, _ = groot.prepare_input(inputs)
    device = next(groot.parameters()).device
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bool(lerobot.config.use_bf16)):
        return backbone_features(groot, backbone_inputs)


def build_feature_cache(
    base: Gr00tPolicy,
    pre: Any,
    data: Gr00tTrainData,
    rows: int = 64,
    progress: Callable[[int], None] | None = None,
) -> FeatureCache:
    """Every frame's backbone output, frames of one prompt together (one length, so no padding);
    ``progress(frames done)`` after each block."""
    by_prompt: dict[str, list[int]] = {}
    for i, prompt in enumerate(data.prompts):
        by_prompt.setdefault(prompt, []).append(i)
    length_of: dict[int, int] = {}
    groups: list[Tensor] = []
    image_masks: list[Tensor] = []
    where = torch.empty((len(data), 2), dtype=torch.int64)
    firsts = []
    done = 0
    for prompt_frames in by_prompt.values():
        parts, image_mask = [], None
        for start in range(0, len(prompt_frames), rows):
            idx = torch.tensor(prompt_frames[start : start + rows])
            out = _backbone_of(base, pre, data.raw_batch(idx))
            if not bool(out["backbone_attention_mask"].all()):
                raise RuntimeError(
                    "feature cache: frames of one prompt came out padded; use finetune.feature_cache = 'off'"
                )
            parts.append(out["backbone_features"].cpu())
            image_mask = out["image_mask"][0].cpu()
            done += len(idx)
            if progress is not None:
                progress(done)
        g = len(groups)
        groups.append(torch.cat(parts))
        image_masks.append(image_mask)  # type: ignore[arg-type]
        for row, i in enumerate(prompt_frames):
            where[i] = torch.tensor([g, row])
        length_of[g] = int(groups[-1].shape[1])
        firsts.append(prompt_frames[0])
    pad_row = None
    if len(set(length_of.values())) > 1:
        pad_row = _pad_feature(base, pre, data, firsts, length_of)
    return FeatureCache(groups, image_masks, where, pad_row)


def _pad_feature(
    base: Gr00tPolicy, pre: Any, data: Gr00tTrainData, firsts: list[int], length_of: dict[int, int]
) -> Tensor:
    """The backbone's feature at a left-pad position: a shortest and a longest frame in one batch.

    LeRobot's VL self-attention attends to pad tokens (unmasked), so batches must carry the very pad
    feature LeRobot's own padded batch has; it is one vector wherever a pad sits, checked here."""
    short = firsts[min(length_of, key=lambda g: length_of[g])]
    long = firsts[max(length_of, key=lambda g: length_of[g])]
    out = _backbone_of(base, pre, data.raw_batch(torch.tensor([short, long])))
    pads = out["backbone_features"][0][~out["backbone_attention_mask"][0]].cpu()
    if pads.shape[0] == 0 or not bool((pads == pads[0]).all()):
        raise RuntimeError(
            "feature cache: this backbone's left-pad features differ by position, so cached frames cannot be "
            "padded as LeRobot pads them; set finetune.feature_cache = 'off'"
        )
    return pads[0].clone()


# --------------------------------------------------------------------------------------------------
# the model and the adapter
# --------------------------------------------------------------------------------------------------
class Gr00tSFTModel(nn.Module):
    """The trainable action head (the only submodule: checkpoints hold ``action_head.*``); the frozen
    backbone and LeRobot's policy stay outside the module tree."""

    def __init__(self, lerobot_policy: Any, tune: tuple[str, ...]) -> None:
        super().__init__()
        self.action_head = lerobot_policy._groot_model.action_head
        self._policy = [lerobot_policy]
        backbone = lerobot_policy._groot_model.backbone
        backbone.requires_grad_(False)
        self.action_head.set_trainable_parameters("projector" in tune, "diffusion_model" in tune, "vlln" in tune)
        config = lerobot_policy.config
        config.tune_projector, config.tune_diffusion_model = "projector" in tune, "diffusion_model" in tune
        config.tune_vlln = "vlln" in tune

    @property
    def lerobot(self) -> Any:
        return self._policy[0]

    def train(self, mode: bool = True) -> Gr00tSFTModel:
        super().train(mode)
        self.lerobot._groot_model.backbone.eval()  # frozen: dropout-free, as LeRobot keeps frozen modules
        return self

    def flow_loss(self, batch: dict[str, Tensor], features: dict[str, Tensor], noise: Tensor, time: Tensor) -> Tensor:
        device = noise.device
        use_bf16 = bool(self.lerobot.config.use_bf16)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
            return groot_flow_loss(
                self.action_head,
                features,
                batch["state"],
                batch["actions"],
                batch["action_mask"],
                batch["embodiment_id"],
                noise,
                time,
                batch.get("state_drop"),
            )


class Gr00tSFTAdapter:
    """``SFTAdapter`` of the groot family (see the module docstring)."""

    supports_fsdp = True  # the head's DiT blocks are the units; fresh_model reloads the folder for export

    def __init__(self) -> None:
        self.base: Gr00tPolicy | None = None
        self.pre: Any = None
        self.post: Any = None
        self.data: Gr00tTrainData | None = None
        self.embodiment = ""
        self.saved_embodiment = ""
        self.init: Path | None = None

    def load_base(self, config: SFTConfig, init: Path | None) -> None:
        if init is None:
            raise CheckpointError("init: GR00T SFT fine-tunes a LeRobot GR00T folder; set init")
        tune = config.finetune.tune
        unknown = [p for p in tune or () if p not in TUNE_PARTS]
        if unknown:
            raise ValueError(f"finetune.tune: {unknown} are not GR00T parts; choose from {list(TUNE_PARTS)}")
        self.base = Gr00tPolicy.from_pretrained(init, device=config.train.device, cuda_graphs=False)
        self.init = Path(init)
        self.saved_embodiment = str(self.base.policy.config.embodiment_tag)

    def _base(self) -> Gr00tPolicy:
        if self.base is None:
            raise RuntimeError("Gr00tSFTAdapter: load_base was not called")
        return self.base

    def _feature_mode(self, config: SFTConfig) -> str:
        mode = config.finetune.feature_cache
        images_change = _changes_images(config.augment)
        if mode == "on" and images_change:
            raise ValueError(
                "finetune.feature_cache = 'on' caches the backbone's output per frame, but [augment] changes the "
                "images every batch (random_shift / brightness / contrast); set them to 0 or "
                "finetune.feature_cache = 'off'"
            )
        if mode == "auto":
            return "off" if images_change else "on"
        return mode

    def load_data(self, config: SFTConfig) -> SFTData:
        from cosmos_robot.data.loader import compute_norm_stats
        from cosmos_robot.data.schema import ACTION, STATE

        base = self._base()
        self.embodiment = config.finetune.embodiment or str(base.policy.config.embodiment_tag)
        demo = load_groot_demos(config, base)
        raw = compute_norm_stats(demo)  # the data's statistics, in LeRobot's keys (its fine-tuning rule)
        stats = {"observation.state": raw[STATE].to_dict(), "action": raw[ACTION].to_dict()}
        self.pre, self.post = self._processors(stats)
        frames, shown = len(demo.prompts), config.train.progress
        with TrainProgress(frames, 0, f"{config.name}: preprocess", shown, unit="frame") as bar:
            data = preprocess_frames(demo, base, self.pre, stats, progress=bar.update)
        if self._feature_mode(config) == "on":
            with TrainProgress(frames, 0, f"{config.name}: backbone features", shown, unit="frame") as bar:
                data.features = build_feature_cache(base, self.pre, data, progress=bar.update)
        self.data = data
        return data

    def _processors(self, stats: dict[str, dict[str, Any]]) -> tuple[Any, Any]:
        """LeRobot's GR00T processors of the checkpoint for ``self.embodiment`` and the data's statistics;
        the folder's own when it was saved for that embodiment (its statistics win, LeRobot's rule)."""
        from lerobot.policies.factory import make_pre_post_processors

        base = self._base()
        if self.embodiment == self.saved_embodiment:
            return base.preprocessor, base.postprocessor
        cfg = copy.deepcopy(base.policy.config)
        cfg.embodiment_tag = self.embodiment
        if self.init is None:
            raise RuntimeError("Gr00tSFTAdapter: load_base was not called")
        saved = json.loads((self.init / "policy_preprocessor.json").read_text())
        vlm = next(s for s in saved["steps"] if s.get("registry_name") == "groot_n1_7_vlm_encode_v1")
        dataset_stats = {
            key: {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in row.items()}
            for key, row in stats.items()
        }
        try:
            pre, post = make_pre_post_processors(
                cfg,
                pretrained_path=str(cfg.base_model_path),
                dataset_stats=dataset_stats,
                preprocessor_overrides={
                    "groot_n1_7_vlm_encode_v1": {"model_name": vlm["config"]["model_name"]},
                    "device_processor": {"device": str(base.device)},
                },
            )
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"finetune.embodiment {self.embodiment!r}: LeRobot could not build GR00T's processors from the base "
                f"{cfg.base_model_path}: {exc}"
            ) from exc
        return pre, post

    def build_model(self, config: SFTConfig, device: torch.device) -> nn.Module:
        return self._wrap(self._base(), config, device)

    def fresh_model(self, config: SFTConfig, device: torch.device) -> nn.Module:
        """A head of its own (not the base's, which FSDP shards): the init folder loaded again."""
        if self.init is None:
            raise RuntimeError("Gr00tSFTAdapter: load_base was not called")
        return self._wrap(Gr00tPolicy.from_pretrained(self.init, device=str(device), cuda_graphs=False), config, device)

    def _wrap(self, base: Gr00tPolicy, config: SFTConfig, device: torch.device) -> nn.Module:
        cfg = base.policy.config
        default = tuple(
            p for p, on in zip(TUNE_PARTS, (cfg.tune_projector, cfg.tune_diffusion_model, cfg.tune_vlln)) if on
        )
        tune = tuple(config.finetune.tune) if config.finetune.tune is not None else default
        base.policy.config.embodiment_tag = self.embodiment
        return Gr00tSFTModel(base.policy, tune).to(device)

    def param_groups(self, model: nn.Module, config: SFTConfig) -> list[dict[str, Any]]:
        """LeRobot's GR00T groups: no weight decay on biases and norms (its optimizer preset)."""
        from lerobot.policies.groot.modeling_groot import GrootPolicy

        groups = GrootPolicy._build_weight_decay_parameter_groups(_groot(model))
        return [{"params": groups[0]["params"], "weight_decay": config.optim.weight_decay}, groups[1]]

    def features(self, model: Gr00tSFTModel, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The batch's cached backbone output, or LeRobot's preprocessor and the backbone run now."""
        if "backbone_features" in batch:
            return {k: batch[k] for k in FEATURE_KEYS}
        if self.data is None:
            raise RuntimeError("Gr00tSFTAdapter: load_data was not called")
        raw = self.data.raw_batch(batch["frames"].cpu(), batch.get("images"))
        return _backbone_of(self._base(), self.pre, raw)

    def flow_loss(self, model: nn.Module, batch: dict[str, Tensor], noise: Tensor, time: Tensor) -> Tensor:
        m = _groot(model)
        return m.flow_loss(batch, self.features(m, batch), noise.to(batch["actions"].dtype), time)

    def sample_time(self, model: nn.Module, n: int, generator: torch.Generator) -> Tensor:
        return sample_groot_time(n, generator, _groot(model).action_head)

    def servable(self, model: nn.Module, data: SFTData, ema: EMA | None) -> Gr00tPolicy:
        """LeRobot's GR00T policy with a copy of the trained head (EMA when given); one shared backbone."""
        m = _groot(model)
        lerobot = m.lerobot
        backbone = lerobot._groot_model.backbone
        served = copy.deepcopy(lerobot, memo={id(backbone): backbone})
        if ema is not None:  # the EMA's names are the SFT model's (action_head.*): copy into the served head
            holder = nn.Module()
            holder.action_head = served._groot_model.action_head
            ema.copy_to(holder)
        served.eval()
        return Gr00tPolicy(served, self.pre, self.post, cuda_graphs=False)


def _groot(model: nn.Module) -> Gr00tSFTModel:
    if not isinstance(model, Gr00tSFTModel):
        raise TypeError(f"Gr00tSFTAdapter: expected a Gr00tSFTModel, got {type(model).__name__}")
    return model
