"""``FlowPolicy``: the flow model behind the client's ``BatchPolicy`` interface, saved as one folder.

A policy is ``input transforms -> model -> output transforms`` plus the normalisation stats:

- input: ``RenameKeys`` (openpi wire keys ``observation/image`` ... -> model keys ``image`` ...),
  ``ResizeImages`` (any camera resolution -> ``config.image_size``), ``NormalizeKeys`` (state);
- model: context from images + state + prompt, then ODE denoising (``sampling.sample_actions``);
- output: ``UnnormalizeKeys`` (actions back to env units), one ``{"actions": float32 (H, D)}`` per obs.

Serving is deterministic by default (``config.serve_noise = "fixed"``): every observation starts
the ODE from the same seeded noise, so identical inputs give identical actions whatever else is in
the batch. The folder (``config.json``, ``model.safetensors``, ``policy.json``) is all that
``from_pretrained`` needs, and every way it can be wrong is a ``CheckpointError`` naming the file,
field or tensor. Trainers build a policy with ``FlowPolicy(model, stats)`` and the default transforms.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from cosmos_robot.config import format_validation_error
from cosmos_robot.normalize import FeatureStats
from cosmos_robot.policies.flow.checkpoint import check_safetensors, load_safetensors, save_safetensors
from cosmos_robot.policies.flow.configuration_flow import FlowConfig
from cosmos_robot.policies.flow.modeling_flow import FlowModel
from cosmos_robot.policies.flow.sampling import sample_actions
from cosmos_robot.policies.flow.text import encode_prompts
from cosmos_robot.policies.registry import CheckpointError, read_json
from cosmos_robot.policies.shape_events import ShapeCounted
from cosmos_robot.transforms import (
    BinarizeActions,
    ConcatKeys,
    NormalizeKeys,
    RenameKeys,
    ResizeImages,
    Transform,
    UnnormalizeKeys,
    run_transforms,
    transforms_from_config,
    transforms_to_config,
)
from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec, TextSpec

__all__ = [
    "CONFIG_FILE",
    "POLICY_FILE",
    "WEIGHTS_FILE",
    "FlowPolicy",
    "collate_observations",
    "default_input_transforms",
    "default_output_transforms",
]

CONFIG_FILE, WEIGHTS_FILE, POLICY_FILE = "config.json", "model.safetensors", "policy.json"
# eval clients may send it; a flow policy ignores it unless its config's state_keys name it
IGNORED_KEYS = frozenset({"observation/object_state"})
StatsLike = Mapping[str, FeatureStats | Mapping[str, Any]]


def _as_stats(stats: StatsLike, config: FlowConfig) -> dict[str, FeatureStats]:
    """``{"state": ..., "actions": ...}`` as FeatureStats, with lengths checked against the config."""
    out: dict[str, FeatureStats] = {}
    for key, dim in (("state", config.state_dim), ("actions", config.action_dim)):
        if key not in stats:
            raise ValueError(f"stats: missing {key!r} (need 'state' and 'actions', got {sorted(stats)})")
        value = stats[key]
        st = value if isinstance(value, FeatureStats) else FeatureStats.from_dict(dict(value), name=f"stats[{key!r}]")
        if st.mean.shape[0] != dim:
            raise ValueError(f"stats[{key!r}]: has {st.mean.shape[0]} dims, the config says {dim}")
        out[key] = st
    return out


def default_input_transforms(config: FlowConfig, stats: StatsLike) -> list[Transform]:
    """Wire keys -> model keys, resize cameras to ``image_size``, concatenate ``state_keys``, normalise."""
    st = _as_stats(stats, config)
    steps: list[Transform] = [RenameKeys(config.wire_keys)]
    if config.cameras:
        steps.append(ResizeImages(tuple(config.cameras), config.image_size, config.image_size))
    if config.state_keys != ("state",) or config.state_shapes:  # joined (arrays flattened) into "state"
        steps.append(ConcatKeys(tuple(config.state_keys), "state", flatten=bool(config.state_shapes)))
    steps.append(NormalizeKeys({"state": st["state"].to_dict()}, config.norm_mode, ("state",)))
    return steps


def default_output_transforms(config: FlowConfig, stats: StatsLike) -> list[Transform]:
    """Model actions (normalised) -> env units (-> the binarised gripper, if the config names one)."""
    st = _as_stats(stats, config)
    steps: list[Transform] = [UnnormalizeKeys({"actions": st["actions"].to_dict()}, config.norm_mode, ("actions",))]
    if config.binarize_action_dims:
        steps.append(BinarizeActions(config.binarize_action_dims))
    return steps


def collate_observations(
    items: Sequence[Mapping[str, Any]], config: FlowConfig, device: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Transformed observations (model keys: cameras HxWx3 uint8, ``state``, ``prompt``) -> a model batch."""
    s = config.image_size
    images = np.empty((len(items), len(config.cameras), s, s, 3), dtype=np.uint8)
    for i, item in enumerate(items):
        for c, cam in enumerate(config.cameras):
            img = np.asarray(item[cam])
            if img.shape != (s, s, 3):
                raise ValueError(f"observation {i}: {cam!r} is {img.shape} after transforms, expected ({s}, {s}, 3)")
            images[i, c] = img
    state = np.stack([np.asarray(item["state"], dtype=np.float32) for item in items])
    if state.shape[1:] != (config.state_dim,):
        keys = " + ".join(f"observation/{k}" for k in config.state_keys)
        raise ValueError(f"state: {keys} has {state.shape[1:]} values, the policy expects ({config.state_dim},)")
    ids, offsets = encode_prompts([str(item.get("prompt", "")) for item in items], config.text_buckets)
    return {
        "images": torch.from_numpy(images).permute(0, 1, 4, 2, 3).contiguous().to(device),
        "state": torch.from_numpy(state).to(device),
        "text_ids": ids.to(device),
        "text_offsets": offsets.to(device),
    }


class FlowPolicy(ShapeCounted, BatchPolicy):
    """Serve a ``FlowModel``: ``infer_batch(list of openpi obs) -> [{"actions": float32 (H, D)}]``."""

    def __init__(
        self,
        model: FlowModel,
        stats: StatsLike,
        input_transforms: Sequence[Transform] | None = None,
        output_transforms: Sequence[Transform] | None = None,
    ) -> None:
        self.model = model.eval()
        self.config = model.config
        self.stats = _as_stats(stats, self.config)
        self.input_transforms = list(input_transforms or default_input_transforms(self.config, self.stats))
        self.output_transforms = list(output_transforms or default_output_transforms(self.config, self.stats))
        self._required = [*self.config.wire_keys, *(["prompt"] if self.config.read_prompt else [])]
        # a prompt-free policy accepts (and ignores) an instruction: clients send one by habit
        self._ignored = (IGNORED_KEYS | {"prompt"}) - set(self._required)
        self._spec = self._build_spec()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- BasePolicy ------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        cfg = self.config
        replan = {} if cfg.replan_steps is None else {"replan_steps": cfg.replan_steps}
        return {
            "type": "flow",
            "action_horizon": cfg.chunk_size,
            **replan,
            "action_dim": cfg.action_dim,
            "state_dim": cfg.state_dim,
            "image_size": cfg.image_size,
            "cameras": list(cfg.cameras),
            "state_keys": list(cfg.state_keys),
            "num_flow_steps": cfg.num_flow_steps,
        }

    @property
    def input_spec(self) -> InputSpec:
        return self._spec

    def _build_spec(self) -> InputSpec:
        fields: dict[str, ArraySpec | TextSpec] = {
            f"observation/{cam}": ArraySpec((None, None, 3), "uint8", description=f"{cam} camera, any size")
            for cam in self.config.cameras
        }
        keys, shapes = self.config.state_keys, self.config.state_shapes
        for key in keys:  # one vector: its length is state_dim; several: the concatenation's is (collate checks)
            if key in shapes:
                fields[f"observation/{key}"] = ArraySpec(tuple(shapes[key]), "floating", description=f"{key} array")
                continue
            shape = (self.config.state_dim,) if len(keys) == 1 else (None,)
            fields[f"observation/{key}"] = ArraySpec(shape, "floating", description=f"{key} vector")
        if self.config.read_prompt:
            fields["prompt"] = TextSpec(description="task instruction")
        return InputSpec(fields, allow_extra=False, ignored_keys=self._ignored)

    def _check_keys(self, obs: Mapping[str, Any], index: int) -> None:
        missing = [k for k in self._required if k not in obs]
        if missing:
            unknown = [k for k in obs if k not in self._required and k not in self._ignored]
            hints = []
            for key in missing:
                close = difflib.get_close_matches(key, [str(u) for u in unknown], n=1)
                if close:
                    hints.append(f"got {close[0]!r} instead of {key!r}?")
            extra = f" ({'; '.join(hints)})" if hints else ""
            raise KeyError(
                f"observation {index}: missing required key {missing[0]!r}{extra}; "
                f"expected keys {self._required}, got {sorted(map(str, obs))}"
            )
        self._spec.validate(obs)  # shapes, dtypes, unknown keys -> ObservationError naming the key

    def serving_noise(self, batch: int) -> torch.Tensor | None:
        """The ODE start x_1 for ``batch`` observations under ``config.serve_noise`` (None: fresh draws)."""
        cfg = self.config
        shape = (batch, cfg.chunk_size, cfg.action_dim)
        if cfg.serve_noise == "zero":
            return torch.zeros(shape)
        if cfg.serve_noise == "fixed":
            gen = torch.Generator().manual_seed(cfg.serve_seed)
            return torch.randn((1, *shape[1:]), generator=gen).expand(shape)
        return None  # "random": drawn from the global RNG by sample_actions

    def denoise(self, context: torch.Tensor) -> torch.Tensor:
        """Normalised action chunks ``(B, H, D)`` for encoded observations: the serving ODE.

        Subclasses swap the sampler here (``cosmos_robot_trainers.rl.sampled_policy``)."""
        return sample_actions(self.model, context, "ode", noise=self.serving_noise(context.shape[0])).actions

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if not obs_batch:
            return []
        items = []
        for i, obs in enumerate(obs_batch):
            self._check_keys(obs, i)
            items.append(run_transforms(self.input_transforms, dict(obs)))
        with torch.inference_mode():
            batch = collate_observations(items, self.config, self.device)
            actions = self.denoise(self.model.encode(batch)).float().cpu().numpy()
        out = []
        for chunk in actions:
            unnorm = run_transforms(self.output_transforms, {"actions": chunk})["actions"]
            out.append({"actions": np.asarray(unnorm, dtype=np.float32)})
        return out

    # --- checkpoint folder -----------------------------------------------------------------------
    def save_pretrained(self, ckpt_dir: str | Path) -> Path:
        """Write ``config.json``, ``model.safetensors`` and ``policy.json`` (transforms + stats)."""
        root = Path(ckpt_dir)
        root.mkdir(parents=True, exist_ok=True)
        (root / CONFIG_FILE).write_text(json.dumps(self.config.model_dump(mode="json"), indent=2) + "\n")
        save_safetensors(self.model, root / WEIGHTS_FILE)
        policy = {
            "input_transforms": transforms_to_config(self.input_transforms),
            "output_transforms": transforms_to_config(self.output_transforms),
            "stats": {key: st.to_dict() for key, st in self.stats.items()},
        }
        (root / POLICY_FILE).write_text(json.dumps(policy, indent=2) + "\n")
        return root

    @classmethod
    def from_pretrained(cls, ckpt_dir: str | Path, device: str | torch.device = "cpu") -> FlowPolicy:
        """Rebuild the identical policy from a folder written by ``save_pretrained``."""
        root = Path(ckpt_dir)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a checkpoint folder (does not exist or is a file)")
        missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE, POLICY_FILE) if not (root / name).is_file()]
        if missing:
            found = sorted(p.name for p in root.iterdir())[:10]
            raise CheckpointError(
                f"{root}: missing {', '.join(missing)} (a flow checkpoint holds {CONFIG_FILE}, {WEIGHTS_FILE} "
                f"and {POLICY_FILE}; found {found or 'nothing'})"
            )
        config_path = root / CONFIG_FILE
        data = read_json(config_path)
        if data.get("type") != "flow":
            raise CheckpointError(f"{config_path}: 'type' is {data.get('type')!r}, expected 'flow'")
        try:
            config = FlowConfig.model_validate(data)
        except ValidationError as exc:
            raise CheckpointError(format_validation_error(exc, FlowConfig, source=str(config_path))) from exc
        with torch.device("meta"):  # shapes only: a config/weights mismatch fails before any allocation
            check_safetensors(FlowModel(config), root / WEIGHTS_FILE)
        model = FlowModel(config)
        load_safetensors(model, root / WEIGHTS_FILE)
        model.to(device)
        policy_path = root / POLICY_FILE
        pdata = read_json(policy_path)
        absent = [k for k in ("input_transforms", "output_transforms", "stats") if k not in pdata]
        if absent:
            raise CheckpointError(f"{policy_path}: missing {absent} (have {sorted(pdata)})")
        try:
            stats = _as_stats(pdata["stats"], config)
            inputs = transforms_from_config(pdata["input_transforms"])
            outputs = transforms_from_config(pdata["output_transforms"])
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{policy_path}: {exc}") from exc
        return cls(model, stats, inputs, outputs)
