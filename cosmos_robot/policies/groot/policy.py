"""``Gr00tPolicy``: a LeRobot GR00T N1.7 checkpoint folder behind the ``BatchPolicy`` interface.

The model and its processors are LeRobot's own (``GrootPolicy.from_pretrained`` and
``make_pre_post_processors(config, pretrained_path=folder)``), so a folder fine-tuned with LeRobot
answers here exactly as it does there. What this adds is the serving edge: openpi and LeRobot key
names (``lerobot_io``), one batched ``predict_action_chunk`` per server batch, metadata that
announces the chunk, the action space, the embodiment and the accepted keys, and loading errors
that name the file or the missing base model.

A LeRobot GR00T folder is not self-contained: its ``config.json`` names the base model
(``base_model_path``: ``nvidia/GR00T-N1.7-3B`` or a local folder) that holds the architecture and
the backbone's config and processor; that base must be a local folder or in the HF cache (fetched only
with ``allow_download``), and no model it names may ship code unless ``trust_remote_code`` (LeRobot
loads them with ``trust_remote_code=True``; :mod:`.remote_code` checks first).
Sampling draws the flow noise from a generator seeded per call (``serve_seed``), so the same batch
of observations gives the same chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.compiling import compile_blocks
from cosmos_robot.policies.cuda_graphs import GraphCache, GraphCaptureError, bucket_size, pad_rows
from cosmos_robot.policies.groot.backbone import FastQwen3Backbone, supports_fast_backbone
from cosmos_robot.policies.groot.fast import chunk_from_inputs, euler_loop
from cosmos_robot.policies.groot.processing import install_caching_processor
from cosmos_robot.policies.groot.remote_code import check_remote_code
from cosmos_robot.policies.lerobot_io import LeRobotIO, LeRobotIOPolicy, check_processor_states
from cosmos_robot.policies.registry import CheckpointError, read_json, require_files, torch_dtype
from cosmos_robot.policies.replicas import Replicable
from cosmos_robot.policies.shape_events import ShapeCounted
from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["Gr00tPolicy"]

log = logging.getLogger(__name__)

REQUIRED_FILES = ("config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json")


# 0: tokens padded as LeRobot pads them (to the batch's longest prompt), its numerics exactly. GR00T's VL
# self-attention and its DiT (inference path) attend to pad tokens unmasked, so padding every prompt to a
# fixed length (``text_tokens=128``: one graph for all ordinary prompts) moves chunks slightly: by up
# to 8e-4 on the tiny random model in fp32, as LeRobot's own mixed-prompt batches already do.
DEFAULT_TEXT_TOKENS = 0
_LONG_PROMPT_MULTIPLE = 64


class Gr00tPolicy(Replicable, ShapeCounted, LeRobotIOPolicy, BatchPolicy):
    """Serve a GR00T N1.7 folder: ``infer_batch(list of obs) -> [{"actions": float32 (H, D)}]``."""

    def __init__(
        self,
        policy: Any,
        preprocessor: Any,
        postprocessor: Any,
        serve_seed: int = 0,
        cuda_graphs: bool = True,
        text_tokens: int = DEFAULT_TEXT_TOKENS,
    ) -> None:
        if isinstance(text_tokens, bool) or not isinstance(text_tokens, int) or text_tokens < 0:
            raise ValueError(f"text_tokens must be a non-negative int (0: no padding), got {text_tokens!r}")
        self.policy = policy.eval()
        self.text_tokens = text_tokens
        self._pad_id = _tokenizer_pad_id(preprocessor)
        self.preprocessor, self.postprocessor = preprocessor, postprocessor
        self.serve_seed = serve_seed
        cfg = policy.config
        self.io = LeRobotIO(cfg.input_features)
        self.action_dim = int(cfg.output_features["action"].shape[0])
        autocast = torch.bfloat16 if cfg.use_bf16 else None
        groot = policy._groot_model
        # the whole chunk (backbone + encoders + flow loop) as one graph per input signature; for a
        # backbone the fast path does not know, LeRobot's backbone runs eagerly and the loop is graphed
        self._backbone = FastQwen3Backbone(groot.backbone) if supports_fast_backbone(groot.backbone) else None
        self._chunk = (
            GraphCache(partial(chunk_from_inputs, self._backbone, groot.action_head), cuda_graphs, autocast)
            if self._backbone is not None
            else None
        )
        self._loop = GraphCache(partial(euler_loop, groot.action_head), cuda_graphs, autocast)
        self._noise_dtype: torch.dtype | None = None

    @classmethod
    def from_pretrained(
        cls,
        ckpt_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: str | None = None,
        cuda_graphs: bool = True,
        compile: bool = False,
        compile_backend: str = "inductor",
        text_tokens: int = DEFAULT_TEXT_TOKENS,
        gpu_images: bool = False,
        trust_remote_code: bool = False,
        allow_download: bool = False,
    ) -> Gr00tPolicy:
        """Load a LeRobot GR00T folder. ``dtype``: cast the weights (``bfloat16``; default: as saved,
        LeRobot's float32, under its bf16 autocast when ``use_bf16``). ``cuda_graphs``: on CUDA the
        whole chunk (backbone, encoders, flow loop) replays as one CUDA graph per input signature
        (:mod:`.fast`, :mod:`.backbone`). ``compile``: ``torch.compile``
        every block of every layer stack (vision tower, language model, VL self-attention, DiT), with
        ``compile_backend`` (``eager``: Dynamo's guards without code generation, for tests).
        ``text_tokens``: the fast path left-pads every sample's tokens to its image tokens plus this
        many (longer prompts: the next multiple of 64), so prompts of any length up to it share one
        graph and one compilation; 0 (default): as LeRobot pads, to the batch's longest prompt, and
        its numerics exactly (see ``DEFAULT_TEXT_TOKENS`` for what padding changes).
        ``gpu_images``: on CUDA, LeRobot's VLM encode step resizes and patchifies the camera images
        on the GPU (its own ``device`` setting; folders trained with albumentations keep their cv2
        path on the CPU). Off by default: LeRobot's default, and not yet measured on the GPU.
        ``trust_remote_code``: serve a folder whose named models ship Python (``auto_map``), which
        LeRobot executes; refused by default (:mod:`.remote_code`). ``allow_download``: fetch named
        hub models missing from the HF cache (never, by default)."""
        root = Path(ckpt_dir)
        weights_dtype = torch_dtype(dtype) if dtype is not None else None
        require_files(root, REQUIRED_FILES, "LeRobot GR00T")
        raw = read_json(root / "config.json")
        if raw.get("type") != "groot":
            raise CheckpointError(f"{root / 'config.json'}: 'type' is {raw.get('type')!r}, expected 'groot'")
        base = raw.get("base_model_path")
        # before LeRobot is imported: every model the folder names is local and ships no code
        check_remote_code(root, raw, trust_remote_code=trust_remote_code, allow_download=allow_download)
        check_processor_states(root, ("policy_preprocessor.json", "policy_postprocessor.json"))
        from lerobot.policies.factory import make_pre_post_processors
        from lerobot.policies.groot import GrootPolicy

        try:
            policy = GrootPolicy.from_pretrained(str(root), local_files_only=not allow_download)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{root}: LeRobot could not load this GR00T policy (base {base!r}): {exc}") from exc
        policy.to(device)
        if weights_dtype is not None:
            policy.to(weights_dtype)
        if compile:
            compile_blocks(policy._groot_model, every_stack=True, backend=compile_backend)
        policy.config.device = str(torch.device(device))
        try:
            pre, post = make_pre_post_processors(
                policy.config,
                pretrained_path=str(root),
                preprocessor_overrides={"device_processor": {"device": str(torch.device(device))}},
            )
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{root}: LeRobot could not load the processor pipelines: {exc}") from exc
        install_caching_processor(pre)  # the same outputs; prompts tokenised once, not every step
        if gpu_images and torch.device(device).type == "cuda":
            for step in pre.steps:
                if type(step).__name__ == "GrootN17VLMEncodeStep" and not getattr(step, "use_albumentations", True):
                    step.device = str(torch.device(device))
        served = cls(policy, pre, post, cuda_graphs=cuda_graphs, text_tokens=text_tokens)
        if compile and served._backbone is not None:
            served._backbone.compile(backend=compile_backend)
        return served

    def save_pretrained(self, ckpt_dir: str | Path) -> Path:
        """LeRobot's folder again: the policy (config naming the same base model) and both processors."""
        root = Path(ckpt_dir)
        self.policy.save_pretrained(root)
        self.preprocessor.save_pretrained(root)
        self.postprocessor.save_pretrained(root)
        return root

    # --- BasePolicy ------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        cfg = self.policy.config
        return {
            "type": "groot",
            "action_horizon": int(self.policy._action_queue_steps),
            "chunk_size": int(cfg.chunk_size),
            "action_dim": self.action_dim,
            "action_space": {"dim": self.action_dim, "embodiment_tag": str(cfg.embodiment_tag)},
            "state_dim": self.io.state_dim,
            "cameras": list(self.io.camera_keys),
            "expected_keys": self.io.expected_keys,
        }

    def reset(self) -> None:
        self.policy.reset()

    def graph_caches(self) -> list[GraphCache | None]:
        return [self._chunk, self._loop]

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def renew_graph_caches(self) -> None:
        head = self.policy._groot_model.action_head
        if self._backbone is not None and self._chunk is not None:
            self._backbone = self._backbone.fork()
            self._chunk = self._chunk.fresh(partial(chunk_from_inputs, self._backbone, head))
        self._loop = self._loop.fresh()

    def infer_batch(self, obs_batch: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if not obs_batch:
            return []
        batch = self.io.batch(obs_batch)
        with torch.inference_mode():
            processed = self.preprocessor(batch)
            chunk = self._predict(processed)
            actions = self.postprocessor(chunk)
        arr = np.asarray(actions.float().cpu().numpy(), dtype=np.float32)
        return [{"actions": a} for a in arr]

    def _predict(self, processed: dict[str, Any]) -> torch.Tensor:
        """LeRobot's ``predict_action_chunk`` (without real-time chunking): the same modules, the same
        noise from the same seeded stream, replayed from a CUDA graph on CUDA."""
        policy = self.policy
        groot = policy._groot_model
        inputs = policy._filter_groot_inputs(processed, include_action=False)
        device = next(groot.parameters()).device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=policy.config.use_bf16):
            backbone_inputs, action_inputs = groot.prepare_input(inputs)
        actions = None
        if self._chunk is not None and "pixel_values_videos" not in backbone_inputs:
            try:
                actions = self._predict_fast(backbone_inputs, action_inputs)
            except ValueError as exc:  # a layout the fast backbone does not plan (mixed image sizes)
                log.warning("GR00T fast path not used for this batch (%s); running LeRobot's backbone", exc)
            except GraphCaptureError as exc:  # keep serving: the stepwise path computes the same chunk
                log.error("GR00T: %s; serving with LeRobot's backbone and the graphed flow loop from now on", exc)
                self._chunk = None
        if actions is None:
            actions = self._predict_stepwise(backbone_inputs, action_inputs)
        actions = actions[:, : policy._resolve_prediction_horizon(actions)]
        return actions[:, :, : self.action_dim]

    def _noise(self, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # GR00T's own draw, from a generator seeded like ``torch.manual_seed(serve_seed)`` seeds the
        # device's default one (the same values LeRobot draws after seeding: nothing before its draw
        # consumes the stream) but private to this call, so replicas serving at once cannot interleave
        head = self.policy._groot_model.action_head
        gen = torch.Generator(device=device).manual_seed(self.serve_seed)
        shape = (batch, head.config.action_horizon, head.action_dim)
        return torch.randn(size=shape, dtype=dtype, device=device, generator=gen)

    def _predict_fast(self, backbone_inputs: Any, action_inputs: Any) -> torch.Tensor:
        assert self._backbone is not None and self._chunk is not None
        head = self.policy._groot_model.action_head
        n = int(backbone_inputs["input_ids"].shape[0])
        device = backbone_inputs["input_ids"].device
        if self._noise_dtype is None:  # once: the VL features' dtype, which GR00T's noise takes
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.policy.config.use_bf16):
                plan = self._backbone.plan(dict(backbone_inputs))
                features = self._backbone.features(backbone_inputs["pixel_values"], backbone_inputs["input_ids"], plan)
                self._noise_dtype = head.vl_self_attention(head.vlln(features)).dtype
        noise = self._noise(n, self._noise_dtype, device)
        size = bucket_size(n)
        model_input = {k: _pad_samples(backbone_inputs[k], n, size) for k in _BACKBONE_KEYS if k in backbone_inputs}
        if self.text_tokens and self._pad_id is not None:
            image_token = self._backbone.qwen.config.image_token_id
            model_input = pad_text(model_input, self.text_tokens, image_token, self._pad_id)
        plan = self._backbone.plan(model_input)
        return self._chunk(
            model_input["pixel_values"],
            model_input["input_ids"],
            pad_rows(action_inputs.state, size),
            pad_rows(action_inputs.embodiment_id, size),
            pad_rows(noise, size),
            *plan.tensors(),
            num_images=plan.num_images,
        )[:n]

    def _predict_stepwise(self, backbone_inputs: Any, action_inputs: Any) -> torch.Tensor:
        """LeRobot's backbone eagerly, then the flow loop (graphed on CUDA)."""
        groot = self.policy._groot_model
        head = groot.action_head
        device = next(groot.parameters()).device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.policy.config.use_bf16):
            backbone_output = groot.backbone(backbone_inputs)
            features = head._encode_features(backbone_output, action_inputs)
            vl = features.backbone_features
            noise = self._noise(vl.shape[0], vl.dtype, vl.device)
        return self._loop(
            vl,
            features.state_features,
            action_inputs.embodiment_id,
            backbone_output.get("image_mask"),
            backbone_output.get("backbone_attention_mask"),
            noise,
        )


_BACKBONE_KEYS = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")
_TOKEN_KEYS = {"input_ids": None, "attention_mask": 0, "mm_token_type_ids": 0}  # per-token rows, pad values


def _tokenizer_pad_id(preprocessor: Any) -> int | None:
    """The pad token of the VLM step's tokenizer (``None``: no such step, the sequence is not padded)."""
    for step in getattr(preprocessor, "steps", []):
        proc = getattr(step, "proc", None)
        pad = getattr(getattr(proc, "tokenizer", None), "pad_token_id", None)
        if pad is not None:
            return int(pad)
    return None


def pad_text(model_input: dict[str, torch.Tensor], text_tokens: int, image_token: int, pad_id: int) -> dict[str, Any]:
    """Left-pad the token rows (as GR00T's processor pads a batch) to the image tokens plus
    ``text_tokens``, or for a longer prompt to the next multiple of 64: one sequence length, hence
    one graph and one compilation, for every prompt of ordinary length. Padded positions are masked,
    so the chunk is the one of the unpadded batch (a test compares them)."""
    ids = model_input["input_ids"]
    length = int(ids.shape[1])
    target = int((ids[0] == image_token).sum()) + text_tokens
    if length > target:
        target = -(-length // _LONG_PROMPT_MULTIPLE) * _LONG_PROMPT_MULTIPLE
    if target == length:
        return model_input
    out: dict[str, Any] = dict(model_input)
    for key, value in _TOKEN_KEYS.items():
        if key in out:
            out[key] = torch.nn.functional.pad(out[key], (target - length, 0), value=pad_id if value is None else value)
    return out


def _pad_samples(t: torch.Tensor, n: int, size: int) -> torch.Tensor:
    """``t`` (per-sample rows, or ``n`` equal groups of rows such as the patches of each sample's
    images) padded to ``size`` samples by repeating the last sample."""
    if size == n:
        return t
    if t.shape[0] % n:
        raise ValueError(f"{t.shape[0]} rows do not split into {n} equal samples")  # the stepwise path serves it
    grouped = t.reshape(n, -1, *t.shape[1:])
    return pad_rows(grouped, size).reshape(-1, *t.shape[1:])
