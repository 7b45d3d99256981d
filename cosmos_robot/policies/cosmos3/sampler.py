"""Our own Cosmos3 action-policy denoising loop over diffusers' ``Cosmos3OmniTransformer``.

Why not ``Cosmos3OmniPipeline.__call__``: the stock pipeline implements only the state-free
sequence plan (all chunk rows noisy, action positions offset by one frame), encodes all chunk + 1
video frames with the VAE although the policy conditions on frame 0 only, and has no guidance
interval. cosmos-framework's released policies need more:

- **state row** (DROID "Case B"): chunk + 1 action rows, row 0 the clean state (no timestep
  embedding, no prediction, written back after every step) and action mRoPE ``start_frame_offset``
  0, so row 0 sits at the temporal position of the conditioning frame;
- **one encoded frame**: the Wan VAE is causal, so latent frame 0 of a one-frame encode equals
  that of the stock 33-frame encode; later latent frames start as noise and are denoised jointly
  (the model was trained with them in the sequence);
- **guidance interval** (the Edge checkpoint): classifier-free guidance only while
  ``t_lo < t < t_hi``; outside it one transformer call per step instead of two;
- **flow UniPC on cosmos-framework's grid**: ``linspace(1 - 1/1000, 0, K + 1)[:-1]`` shifted by
  ``shift``, one scheduler copy per modality.

With ``state_row=None`` the loop reproduces the stock pipeline's ``.action`` bit for bit for the
same seed (a test checks it), which pins every shared convention (prompt JSON, canvas and padding,
noise draw order, CFG) to diffusers' implementation. The transformer packs one sequence with no
block mask, so each observation is its own call (batch 1), as in the stock pipeline.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Cosmos3Sampler", "SampleSettings"]


@dataclass(frozen=True)
class SampleSettings:
    """Everything one chunk depends on besides the observation."""

    chunk: int
    num_steps: int
    guidance: float
    shift: float
    domain_id: int
    raw_dim: int
    fps: float
    resolution_tier: int
    view_point: str = "ego_view"
    view_description: str | None = None  # appended to the prompt's framing (cosmos-framework's concat view)
    guidance_interval: tuple[float, float] | None = None  # CFG only while t_lo < t < t_hi (t in [0, 1000])
    negative_prompt: str = ""
    reimpose_clean: bool = True  # write the clean frame / state row back after every scheduler step


class Cosmos3Sampler:
    """Action chunks from a loaded ``Cosmos3OmniPipeline`` (its transformer, VAE, tokenizer, scheduler)."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    # --- prompt ------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt: str, s: SampleSettings, num_frames: int, height: int, width: int) -> tuple[Any, Any]:
        pipe = self.pipe
        if not s.view_description:
            return pipe.tokenize_prompt(
                prompt,
                s.negative_prompt,
                num_frames=num_frames,
                height=height,
                width=width,
                fps=s.fps,
                use_system_prompt=None,
                action_mode="policy",
                action_view_point=s.view_point,
            )
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _SYSTEM_PROMPT_VIDEO

        text = json.loads(
            pipe._build_action_json_prompt(
                prompt, view_point=s.view_point, num_frames=num_frames, fps=s.fps, height=height, width=width
            )
        )
        framing = text.get("cinematography", {}).get("framing", "")
        sep = " " if framing.endswith(".") else ". "
        text.setdefault("cinematography", {})["framing"] = (framing + sep if framing else "") + s.view_description
        use_system = pipe.config.default_use_system_prompt

        def ids(content: str) -> list[int]:
            conv = [{"role": "system", "content": _SYSTEM_PROMPT_VIDEO}] if use_system else []
            conv.append({"role": "user", "content": content})
            enc = pipe.text_tokenizer.apply_chat_template(
                conv, tokenize=True, add_generation_prompt=True, add_vision_id=False, return_dict=True
            )
            special = pipe.llm_special_tokens
            return [*enc.input_ids, special["eos_token_id"], special["start_of_generation"]]

        return ids(json.dumps(text)), ids(s.negative_prompt)

    # --- the packed sequence -------------------------------------------------------------------------
    def _pack(
        self, input_ids: Any, latents: torch.Tensor, rows: int, clean_rows: list[int], offset: int, fps: float
    ) -> tuple[dict[str, Any], dict[str, int]]:
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

        pipe, device = self.pipe, self.pipe._get_execution_device()
        cfg = pipe.transformer.config
        text = pipe._prepare_text_segment(input_ids, device=device)
        vis = pipe._prepare_vision_segment(
            input_vision_tokens=latents,
            has_image_condition=True,
            mrope_offset=text["vision_start_temporal_offset"],
            vision_fps=fps,
            curr=text["und_len"],
            device=device,
            condition_frame_indexes=[0],
        )
        act = pipe._prepare_action_segment(
            input_action_tokens=torch.zeros(rows, pipe.transformer.action_dim),
            condition_frame_indexes=clean_rows,
            mrope_offset=text["vision_start_temporal_offset"],
            action_fps=fps,
            curr=text["und_len"] + vis["num_vision_tokens"],
            device=device,
        )
        # diffusers fixes start_frame_offset=1 (no state row); rebuild the action positions with ours
        act["action_mrope_ids"] = get_3d_mrope_ids_vae_tokens(
            grid_t=rows,
            grid_h=1,
            grid_w=1,
            temporal_offset=text["vision_start_temporal_offset"],
            reset_spatial_indices=cfg.unified_3d_mrope_reset_spatial_ids,
            fps=fps if cfg.enable_fps_modulation else None,
            base_fps=float(cfg.base_fps),
            temporal_compression_factor=1,
            base_temporal_compression_factor=pipe.vae_scale_factor_temporal,
            start_frame_offset=offset,
        )[0].to(device)
        seq_len = text["und_len"] + vis["num_vision_tokens"] + act["action_len"]
        kwargs = {
            "input_ids": text["input_ids"],
            "text_indexes": text["text_indexes"],
            "position_ids": torch.cat([text["text_mrope_ids"], vis["vision_mrope_ids"], act["action_mrope_ids"]], 1),
            "und_len": text["und_len"],
            "sequence_length": seq_len,
            "vision_token_shapes": vis["vision_token_shapes"],
            "vision_sequence_indexes": vis["vision_sequence_indexes"],
            "vision_mse_loss_indexes": vis["vision_mse_loss_indexes"],
            "vision_noisy_frame_indexes": vis["vision_noisy_frame_indexes"],
            "action_token_shapes": act["action_token_shapes"],
            "action_sequence_indexes": act["action_sequence_indexes"],
            "action_mse_loss_indexes": act["action_mse_loss_indexes"],
            "action_noisy_frame_indexes": act["action_noisy_frame_indexes"],
        }
        sizes = {
            "noisy_vision": vis["num_noisy_vision_tokens"],
            "noisy_action": act["num_noisy_action_tokens"],
            "seq_len": seq_len,
        }
        return kwargs, sizes

    def _schedulers(self, s: SampleSettings) -> tuple[Any, Any]:
        from diffusers import UniPCMultistepScheduler

        sched = UniPCMultistepScheduler.from_config(
            self.pipe.scheduler.config,
            use_flow_sigmas=True,
            use_karras_sigmas=False,
            flow_shift=s.shift,
            prediction_type="flow_prediction",
        )
        sigmas = np.linspace(1.0 - 1.0 / sched.config.num_train_timesteps, 0.0, s.num_steps + 1)[:-1]
        sched.set_timesteps(s.num_steps, device=self.pipe._get_execution_device(), sigmas=sigmas)
        return sched, copy.deepcopy(sched)

    # --- one chunk ---------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self, image: np.ndarray, prompt: str, s: SampleSettings, state_row: np.ndarray | None, seed: int
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Denoised action rows (chunk, raw_dim), model units (no state row), and call facts."""
        from diffusers.utils.torch_utils import randn_tensor

        pipe = self.pipe
        device, dtype = pipe._get_execution_device(), pipe.transformer.dtype
        width = pipe.transformer.action_dim
        num_frames = s.chunk + 1
        latent_t = (num_frames - 1) // pipe.vae_scale_factor_temporal + 1
        frame0, image_size, height, wide = pipe._prepare_action_video_conditioning(
            [image], s.resolution_tier, 1, device=device, dtype=torch.float32
        )
        x0 = pipe._encode_video(frame0).contiguous().float()
        x0 = pipe._remove_action_video_padding_from_latent(x0, image_size)  # (1, C, 1, h, w)
        # noise in the stock pipeline's draw order (vision, then actions): same seed, same numbers
        gen = torch.Generator(device="cpu").manual_seed(seed)
        vnoise = randn_tensor((1, x0.shape[1], latent_t, x0.shape[3], x0.shape[4]), generator=gen, device=device)
        anoise = randn_tensor((s.chunk, width), generator=gen, device=device, dtype=torch.float32)
        latents = torch.cat([x0, vnoise[:, :, 1:]], dim=2)
        if state_row is not None:
            row = torch.zeros(1, width, device=device)
            sv = torch.as_tensor(np.asarray(state_row, np.float32), device=device)
            row[0, : sv.numel()] = sv
            actions, clean, offset = torch.cat([row, anoise], 0), [0], 0
        else:
            actions, clean, offset = anoise, [], 1
        actions[:, s.raw_dim :] = 0
        clean_values = actions[: len(clean)].clone()
        act_mask = torch.zeros(actions.shape[0], 1)
        act_mask[clean] = 1.0
        vis_mask = torch.zeros(latents.shape[2], 1, 1)
        vis_mask[0] = 1.0
        cond_ids, uncond_ids = self._prompt_ids(prompt, s, num_frames, height, wide)
        packed = {
            name: self._pack(ids, latents, actions.shape[0], clean, offset, s.fps)
            for name, ids in (("cond", cond_ids), ("uncond", uncond_ids))
        }
        domain = torch.tensor([s.domain_id], dtype=torch.long, device=device)
        vsched, asched = self._schedulers(s)
        timesteps = vsched.timesteps
        calls = 0

        def velocity(name: str, i: int, t: float, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal calls
            kwargs, sizes = packed[name]
            with pipe.transformer.cache_context(name, step_index=i, sigma=sigma, num_inference_steps=len(timesteps)):
                pv, _, pa = pipe.transformer(
                    **kwargs,
                    vision_tokens=[latents.to(dtype)],
                    vision_timesteps=torch.full((sizes["noisy_vision"],), t, device=device),
                    action_tokens=[actions.to(dtype)],
                    action_timesteps=torch.full((sizes["noisy_action"],), t, device=device),
                    action_domain_ids=[domain],
                    return_dict=False,
                )
            calls += 1
            vv, _, va = pipe._mask_velocity_predictions(
                pv,
                None,
                vision_condition_mask=[vis_mask],
                preds_action=pa,
                action_condition_mask=[act_mask],
                raw_action_dim=s.raw_dim,
            )
            return vv.float(), va.float()

        for i, t_tensor in enumerate(timesteps):
            t = t_tensor.item()
            sigma = float(vsched.sigmas[i])
            cv, ca = velocity("cond", i, t, sigma)
            interval = s.guidance_interval
            if s.guidance != 1.0 and (interval is None or interval[0] < t < interval[1]):
                uv, ua = velocity("uncond", i, t, sigma)
                cv, ca = uv + s.guidance * (cv - uv), ua + s.guidance * (ca - ua)
            latents = vsched.step(cv[None], t_tensor, latents[None], return_dict=False)[0][0]
            actions = asched.step(ca[None], t_tensor, actions[None], return_dict=False)[0][0]
            actions[:, s.raw_dim :] = 0
            if s.reimpose_clean:
                latents[:, :, :1] = x0
                actions[: len(clean)] = clean_values
        out = actions[len(clean) :, : s.raw_dim].float().cpu().numpy()
        return out, {"transformer_calls": calls, "seq_len": packed["cond"][1]["seq_len"], "canvas": (height, wide)}
