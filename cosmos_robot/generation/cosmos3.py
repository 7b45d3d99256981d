"""Cosmos3 as a text-to-image / text-to-video generator: the training forward, VAE codec and sampler.

Post-training a generator (SFT, Flow-DPO, DiffusionNFT) needs three things the stock
``Cosmos3OmniPipeline.__call__`` does not give: the transformer's conditional velocity at an
arbitrary ``(x_t, t)`` with gradients (the losses are all on the forward process), the VAE as an
encoder of training images, and sampling that returns the latents it decoded (NFT and DPO regress on
them). This module builds all three from the pipeline's own parts, so nothing about the packing
(chat-templated prompt ids, the resolution/duration templates, 3-D mRoPE positions, noisy-frame
indexes) is reimplemented: :meth:`Cosmos3Generator.velocity` calls the pipeline's
``_prepare_text_segment`` / ``_prepare_vision_segment`` exactly as ``__call__`` does, and a test holds
it bitwise equal to the velocity the pipeline computes inside its own loop (image and video).

Conventions (flow matching, the pipeline's): latents are the VAE's normalised ones
(``(z - mean) / std``); ``x_t = (1 - s) x0 + s eps`` with ``s`` in (0, 1); the transformer's timestep is
``s * 1000``; its output is the velocity ``v = eps - x0`` (``flow_prediction``: ``x0 = x_t - s v``).
The transformer packs one sample per call (no block mask), so a batch is a loop of calls.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["Cosmos3Generator", "GenShape"]

NUM_TRAIN_TIMESTEPS = 1000  # the pipeline's flow scheduler: transformer timestep = sigma * 1000


@dataclass(frozen=True)
class GenShape:
    """What is generated: ``num_frames`` 1 is an image; video frame counts are ``4k + 1`` (Wan VAE)."""

    num_frames: int = 1
    height: int = 64
    width: int = 64
    fps: float = 24.0

    def __post_init__(self) -> None:
        if self.num_frames < 1 or (self.num_frames - 1) % 4:
            raise ValueError(f"num_frames: expected 1 (an image) or 4k + 1 (a video), got {self.num_frames}")
        for name in ("height", "width"):
            if getattr(self, name) < 16 or getattr(self, name) % 16:
                raise ValueError(
                    f"{name}: expected a multiple of 16 (the VAE's compression), got {getattr(self, name)}"
                )

    @property
    def is_image(self) -> bool:
        return self.num_frames == 1


class Cosmos3Generator:
    """Training forward, VAE codec and deterministic sampler over a loaded ``Cosmos3OmniPipeline``."""

    def __init__(self, pipe: Any, negative_prompt: str = "") -> None:
        self.pipe = pipe
        self.negative_prompt = negative_prompt
        self._packed: dict[tuple[Any, ...], dict[str, Any]] = {}

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu") -> Cosmos3Generator:
        """A diffusers Cosmos3 folder (``model_index.json``, ``transformer/``, ``vae/``, ...)."""
        from diffusers import Cosmos3OmniPipeline

        folder = Path(path)
        if not (folder / "model_index.json").is_file():
            raise ValueError(f"{folder}: not a diffusers pipeline folder (no model_index.json)")
        pipe = Cosmos3OmniPipeline.from_pretrained(str(folder), enable_safety_checker=False)
        pipe.to(device)
        return cls(pipe)

    @property
    def transformer(self) -> Any:
        return self.pipe.transformer

    @contextmanager
    def using(self, transformer: Any) -> Iterator[Cosmos3Generator]:
        """Run ``velocity`` / ``sample`` with another transformer of the same config (an old policy, a
        reference) in place of the pipeline's, sharing the VAE, tokenizer, scheduler and packing cache."""
        own = self.pipe.transformer
        self.pipe.transformer = transformer
        try:
            yield self
        finally:
            self.pipe.transformer = own

    @property
    def device(self) -> torch.device:
        return torch.device(self.pipe._get_execution_device())

    def latent_shape(self, shape: GenShape) -> tuple[int, int, int, int]:
        """``(C, T, h, w)`` of one sample's latents."""
        pipe = self.pipe
        t = (shape.num_frames - 1) // pipe.vae_scale_factor_temporal + 1
        s = pipe.vae_scale_factor_spatial
        return int(pipe.vae.config.z_dim), t, shape.height // s, shape.width // s

    # --- prompts and packing ---------------------------------------------------------------------
    def prompt_ids(self, prompt: str, shape: GenShape) -> tuple[list[int], list[int]]:
        """``(cond, uncond)`` token ids: the pipeline's chat template and resolution/duration sentences."""
        return self.pipe.tokenize_prompt(
            prompt,
            self.negative_prompt,
            num_frames=shape.num_frames,
            height=shape.height,
            width=shape.width,
            fps=shape.fps,
            use_system_prompt=None,
        )

    def packed(self, ids: Sequence[int], shape: GenShape) -> dict[str, Any]:
        """The step-invariant transformer arguments of one sample (cached per ids and shape)."""
        key = (tuple(ids), shape)
        hit = self._packed.get(key)
        if hit is not None:
            return hit
        pipe, device = self.pipe, self.device
        text = pipe._prepare_text_segment(list(ids), device=device)
        probe = torch.zeros(1, *self.latent_shape(shape))
        vis = pipe._prepare_vision_segment(
            input_vision_tokens=probe,
            has_image_condition=False,
            mrope_offset=text["vision_start_temporal_offset"],
            vision_fps=shape.fps,
            curr=text["und_len"],
            device=device,
            condition_frame_indexes=[],
        )
        packed = {
            "input_ids": text["input_ids"],
            "text_indexes": text["text_indexes"],
            "position_ids": torch.cat([text["text_mrope_ids"], vis["vision_mrope_ids"]], dim=1),
            "und_len": text["und_len"],
            "sequence_length": text["und_len"] + vis["num_vision_tokens"],
            "vision_token_shapes": vis["vision_token_shapes"],
            "vision_sequence_indexes": vis["vision_sequence_indexes"],
            "vision_mse_loss_indexes": vis["vision_mse_loss_indexes"],
            "vision_noisy_frame_indexes": vis["vision_noisy_frame_indexes"],
            "_noisy_tokens": vis["num_noisy_vision_tokens"],
        }
        if len(self._packed) > 4096:  # prompts are few in practice; bound the cache anyway
            self._packed.clear()
        self._packed[key] = packed
        return packed

    # --- the forward process ---------------------------------------------------------------------
    def velocity(self, x_t: torch.Tensor, timestep: float | torch.Tensor, ids: Sequence[int], shape: GenShape) -> Any:
        """The conditional velocity ``(C, T, h, w)`` at one sample's ``x_t`` ``(C, T, h, w)`` and transformer
        timestep (``sigma * 1000``, or a scheduler timestep); differentiable, in the transformer's dtype."""
        return self._velocity(x_t[None], timestep, ids, shape)[0]

    def _velocity(self, x_t: torch.Tensor, timestep: float | torch.Tensor, ids: Sequence[int], shape: GenShape) -> Any:
        """``velocity`` on the pipeline's own layout, ``(1, C, T, h, w)`` in and out."""
        packed = self.packed(ids, shape)
        kwargs = {k: v for k, v in packed.items() if not k.startswith("_")}
        t = timestep.item() if isinstance(timestep, torch.Tensor) else timestep  # an int stays an int, as there
        preds, _, _ = self.transformer(
            **kwargs,
            vision_tokens=[x_t.to(self.device, self.transformer.dtype)],
            vision_timesteps=torch.full((packed["_noisy_tokens"],), t, device=self.device),
            return_dict=False,
        )
        return preds[0]

    def velocities(self, x_t: torch.Tensor, sigmas: torch.Tensor, ids: Sequence[Sequence[int]], shape: GenShape) -> Any:
        """``(B, C, T, h, w)`` velocities of a batch (one transformer call per sample), float32."""
        if x_t.shape[0] != len(ids) or sigmas.shape[0] != len(ids):
            raise ValueError(
                f"batch mismatch: x_t {tuple(x_t.shape)}, sigmas {tuple(sigmas.shape)}, {len(ids)} prompts"
            )
        outs = [
            self.velocity(x_t[i], float(sigmas[i]) * NUM_TRAIN_TIMESTEPS, ids[i], shape).float()
            for i in range(len(ids))
        ]
        return torch.stack(outs)

    # --- VAE ---------------------------------------------------------------------------------------
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """``(B, 3, F, H, W)`` pixels in [-1, 1] -> normalised latents ``(B, C, T, h, w)`` (the posterior mean)."""
        if pixels.ndim != 5 or pixels.shape[1] != 3:
            raise ValueError(f"pixels: expected (B, 3, frames, H, W) in [-1, 1], got {tuple(pixels.shape)}")
        return self.pipe._encode_video(pixels.to(self.device)).float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``(B, C, T, h, w)`` -> pixels ``(B, 3, F, H, W)`` in [-1, 1] (the pipeline's
        un-normalisation and ``vae.decode``)."""
        pipe, vae = self.pipe, self.pipe.vae
        mean = pipe._vae_latents_mean.to(latents.device, vae.dtype).view(1, -1, 1, 1, 1)
        inv_std = pipe._vae_latents_inv_std.to(latents.device, vae.dtype).view(1, -1, 1, 1, 1)
        raw = latents.to(vae.dtype) / inv_std + mean
        return vae.decode(raw).sample.float().clamp(-1, 1)

    # --- sampling ----------------------------------------------------------------------------------
    def _scheduler(self, num_steps: int) -> Any:
        import copy

        sched = copy.deepcopy(self.pipe.scheduler)
        if self.pipe.config.use_native_flow_schedule:
            sigmas = np.linspace(1.0 - 1.0 / sched.config.num_train_timesteps, 0.0, num_steps + 1)[:-1]
            sched.set_timesteps(num_steps, device=self.device, sigmas=sigmas)
        else:
            sched.set_timesteps(num_steps, device=self.device)
        return sched

    @torch.no_grad()
    def sample(
        self, prompt: str, shape: GenShape, seed: int, num_steps: int = 8, guidance: float = 1.0
    ) -> torch.Tensor:
        """Normalised latents ``(C, T, h, w)`` of one prompt, the pipeline's loop for ``output_type="latent"``
        with a CPU generator seeded ``seed`` (deterministic: the ODE from that noise)."""
        from diffusers.utils.torch_utils import randn_tensor

        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        latents = randn_tensor((1, *self.latent_shape(shape)), generator=gen, device=self.device, dtype=torch.float32)
        return self.denoise(latents, prompt, shape, num_steps, guidance)[0]

    @torch.no_grad()
    def denoise(
        self, latents: torch.Tensor, prompt: str, shape: GenShape, num_steps: int, guidance: float = 1.0
    ) -> torch.Tensor:
        """Run the pipeline's flow-UniPC ODE from ``latents`` ``(1, C, T, h, w)`` (pure noise) to clean latents."""
        cond, uncond = self.prompt_ids(prompt, shape)
        sched = self._scheduler(num_steps)
        for t in sched.timesteps:
            v = self._velocity(latents, t, cond, shape).float()
            if guidance > 1.0:
                u = self._velocity(latents, t, uncond, shape).float()
                v = u + guidance * (v - u)
            latents = sched.step(v.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False)[0].squeeze(0)
        return latents
