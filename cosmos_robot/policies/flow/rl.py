"""The ``flow`` family's RL adapter: the ``FlowModel`` itself is the ``RLModel``.

Our own checkpoint carries its transforms and normalisation stats in ``policy.json``; the adapter
runs the same input transforms serving runs (so rollouts store exactly what serving would feed) and
the output transforms on sampled chunks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.flow.modeling_flow import FlowModel
from cosmos_robot.policies.flow.policy import FlowPolicy, collate_observations
from cosmos_robot.policies.interfaces import Demonstrations, ModelInputs, RLAdapter, RLModel
from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot.transforms import run_transforms
from cosmos_robot.transforms.common import BinarizeActions, NormalizeKeys, UnnormalizeKeys
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

    def demonstrations(self, root: str | Path, *, max_episodes_per_task: int | None = None) -> Demonstrations:
        """The recording at ``root`` as this checkpoint's rollouts see the world: every frame becomes the
        wire observation a client would send (``observation/<camera>`` at the model's image size,
        ``observation/<state key>``, ``prompt``) and goes through ``model_inputs`` (the checkpoint's own
        input transforms); its action chunk is normalised by the inverse of the checkpoint's
        ``UnnormalizeKeys`` (a ``BinarizeActions`` after it is serving's post-processing, not part of the
        model's space, as in SFT). Any other output transform is refused rather than guessed."""
        from cosmos_robot.data.loader import first_episodes_per_task, load_demonstrations

        cfg = self.policy.config
        outputs = self.policy.output_transforms
        unnorm = [t for t in outputs if isinstance(t, UnnormalizeKeys) and "actions" in (t.keys or t.stats)]
        if len(unnorm) != 1 or any(not isinstance(t, UnnormalizeKeys | BinarizeActions) for t in outputs):
            names = [type(t).__name__ for t in outputs]
            raise CheckpointError(
                f"demonstrations: this checkpoint's output transforms {names} cannot be inverted to map "
                "demonstrated actions into the model's space (one UnnormalizeKeys of 'actions' [+ BinarizeActions])"
            )
        keys = tuple(cfg.state_keys)
        demo = load_demonstrations(
            root, chunk_size=cfg.chunk_size, image_size=cfg.image_size, cameras=tuple(cfg.cameras), state_keys=keys
        )
        keep = first_episodes_per_task(demo.episode_index.numpy(), demo.prompts, max_episodes_per_task)
        idx = torch.arange(len(demo)) if keep is None else keep
        if demo.actions.shape[-1] != cfg.action_dim:
            raise ValueError(f"{root}: actions have {demo.actions.shape[-1]} dims, the checkpoint's {cfg.action_dim}")
        widths = [int(np.prod(demo.info["features"][f"observation.{key}"]["shape"])) for key in keys]
        parts = dict(zip(keys, torch.split(demo.state[idx], widths, dim=1), strict=True))
        images = demo.images[idx].permute(0, 1, 3, 4, 2).numpy()  # (N, cams, S, S, 3) as a client sends them
        prompts = [demo.prompts[i] for i in idx.tolist()]
        wire = [
            {
                **{f"observation/{key}": parts[key][n].numpy() for key in keys},
                **{f"observation/{cam}": images[n, c] for c, cam in enumerate(cfg.cameras)},
                "prompt": prompts[n],
            }
            for n in range(len(prompts))
        ]
        normalize = NormalizeKeys(unnorm[0].stats, unnorm[0].mode, unnorm[0].keys)
        chunks = torch.from_numpy(normalize({"actions": demo.actions[idx].numpy()})["actions"]).float()
        pad = demo.action_is_pad[idx].bool()
        chunks[pad] = 0.0
        inputs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in self.model_inputs(wire).items()}
        return Demonstrations(inputs=inputs, chunks=chunks, pad=pad, prompts=prompts, episode=demo.episode_index[idx])

    def serving_noise(self, batch: int) -> torch.Tensor | None:
        return self.policy.serving_noise(batch)

    def set_num_flow_steps(self, steps: int) -> None:
        super().set_num_flow_steps(steps)
        self.policy.config = self.model.config
