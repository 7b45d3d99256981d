"""``Pi05Policy``: a LeRobot pi0.5 checkpoint folder behind the ``BatchPolicy`` interface.

The request path, for a batch of observations from any of our transports:

1. wire keys -> LeRobot keys at the edge: LeRobot's own names (``observation.images.<cam>``,
   ``observation.state``, ``task``) or openpi's (``observation/<cam>``, ``observation/state``,
   ``prompt``; for LIBERO's ``image``/``image2`` cameras also ``observation/image`` and
   ``observation/wrist_image``). Images may be HxWx3 uint8 (openpi) or 3xHxW float in [0, 1] (LeRobot);
2. LeRobot's own preprocessor pipeline from the folder (quantile normalisation, the discretised
   state written into the prompt, tokenisation): the same code that trained the checkpoint;
3. the native model (``modeling.Pi05Model``): cameras resized with padding to the vision size, the
   prefix encoded once, K Euler flow steps of the action expert against the cached prefix;
4. LeRobot's postprocessor (unnormalise), one ``{"actions": float32 (n_action_steps, action_dim)}``
   per observation.

Serving noise is seeded per observation (``serve_seed``), so identical observations give identical
chunks whatever else shares the batch; ``noise=`` overrides it (parity checks, RL samplers).
"""

from __future__ import annotations

import copy
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cosmos_robot.policies.cuda_graphs import GraphCache, GraphCaptureError
from cosmos_robot.policies.fp8 import check_fp8_device
from cosmos_robot.policies.lerobot_io import TASK_KEY, LeRobotIO, LeRobotIOPolicy, check_processor_states
from cosmos_robot.policies.pi05.checkpoint import (
    CONFIG_FILE,
    POSTPROCESSOR_FILE,
    PREPROCESSOR_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    architecture_from_config,
    check_folder,
    find_tokenizer,
    load_weights,
    read_config,
    save_weights,
    write_architecture,
)
from cosmos_robot.policies.pi05.modeling import (
    ATTENTION_IMPLS,
    GraphedGenerate,
    Pi05Architecture,
    Pi05Model,
    PrefixCache,
)
from cosmos_robot.policies.registry import CheckpointError, torch_dtype
from cosmos_robot.policies.replicas import Replicable
from cosmos_robot.policies.shape_events import ShapeCounted
from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["Pi05Inputs", "Pi05Policy", "build_processors", "resize_with_pad"]

log = logging.getLogger(__name__)

ACTION_KEY = "action"
TOKENS_KEY, TOKEN_MASK_KEY = "observation.language.tokens", "observation.language.attention_mask"


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, 3, H, W) float in [0, 1] -> (B, 3, size, size): aspect kept, centred zero padding (openpi)."""
    b, c, h, w = images.shape
    if (h, w) == (size, size):
        return images
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    out = F.interpolate(images, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, left = (size - rh) // 2, (size - rw) // 2
    return F.pad(out, (left, size - rw - left, top, size - rh - top), value=0.0)


class Pi05Inputs:
    """A model-ready batch: camera tensors in [-1, 1] at the vision size, their masks, prompt tokens."""

    def __init__(
        self, images: list[torch.Tensor], image_masks: list[torch.Tensor], tokens: torch.Tensor, mask: torch.Tensor
    ):
        self.images, self.image_masks, self.tokens, self.token_mask = images, image_masks, tokens, mask

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])


def build_processors(lerobot_config: Any, stats: Mapping[str, Mapping[str, Any]], tokenizer: Any) -> tuple[Any, Any]:
    """LeRobot's pi05 processor pipelines (as ``make_pi05_pre_post_processors``) around a given tokenizer.

    LeRobot's factory loads ``google/paligemma-3b-pt-224`` by name, which cannot work offline; the
    steps and their order are LeRobot's, only the tokenizer object is passed in.
    """
    from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep
    from lerobot.processor import (
        AbsoluteActionsProcessorStep,
        RelativeActionsProcessorStep,
        TokenizerProcessorStep,
        make_default_policy_processor_steps,
        make_policy_processor_pipelines,
    )

    cfg = lerobot_config
    tensors = {k: {s: torch.as_tensor(np.asarray(v, dtype=np.float32)) for s, v in d.items()} for k, d in stats.items()}
    relative = RelativeActionsProcessorStep(
        enabled=cfg.use_relative_actions,
        exclude_joints=getattr(cfg, "relative_exclude_joints", []),
        action_names=getattr(cfg, "action_feature_names", None),
    )
    steps = make_default_policy_processor_steps(cfg, tensors)
    inputs = [
        steps.rename_observations,
        steps.add_batch_dim,
        relative,
        steps.normalize,
        Pi05PrepareStateTokenizerProcessorStep(max_state_dim=cfg.max_state_dim),
        TokenizerProcessorStep(
            tokenizer=tokenizer, max_length=cfg.tokenizer_max_length, padding_side="right", padding="max_length"
        ),
        steps.to_device,
    ]
    outputs = [
        steps.unnormalize,
        AbsoluteActionsProcessorStep(enabled=cfg.use_relative_actions, relative_step=relative),
        steps.to_cpu,
    ]
    return make_policy_processor_pipelines(input_steps=inputs, output_steps=outputs)


def resolve_attention(name: str | None, compiled: bool, float32: bool = False) -> str | None:
    """``"auto"`` -> ``"eager"`` for a float32 model (LeRobot's own attention op for op: float32 is the
    reference precision, and on the CPU it makes our chunk bitwise LeRobot's, where the fused kernel
    differs by 5e-8), else what measured fastest on the H200 (docs/benchmarks.md): ``"math"`` where
    Inductor compiles the chunk (it fuses the matmuls and softmax: 21.0 against 32.4 ms per chunk at
    batch 1), the fused SDPA kernel otherwise; any other name is passed through (``None``: leave the
    model's)."""
    if name == "auto":
        if float32:
            return "eager"
        return "math" if compiled else "sdpa"
    if name is not None and name not in ATTENTION_IMPLS:
        raise ValueError(f"attention {name!r} is not one of {['auto', *ATTENTION_IMPLS]}")
    return name


class Pi05Policy(Replicable, ShapeCounted, LeRobotIOPolicy, BatchPolicy):
    """Serve a pi0.5 checkpoint: ``infer_batch(list of obs) -> [{"actions": float32 (H, D)}]``."""

    def __init__(
        self,
        model: Pi05Model,
        lerobot_config: Any,
        preprocessor: Any,
        postprocessor: Any,
        tokenizer: Any,
        *,
        serve_seed: int = 0,
        num_steps: int | None = None,
        cuda_graphs: bool | None = None,
        compile: bool | str = False,
        trim_prompt: int = 0,
        attention: str | None = "auto",
        compile_backend: str = "inductor",
    ) -> None:
        self.model = model.eval()
        self.lerobot_config = lerobot_config
        self.preprocessor, self.postprocessor, self.tokenizer = preprocessor, postprocessor, tokenizer
        self.serve_seed = serve_seed
        self.num_steps = int(num_steps or lerobot_config.num_inference_steps)
        self.io = LeRobotIO(lerobot_config.input_features)
        self.camera_keys, self.state_dim = self.io.camera_keys, self.io.state_dim
        self.action_dim = int(lerobot_config.output_features[ACTION_KEY].shape[0])
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if use_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on a CUDA device, it is on {self.device}")
        float32 = all(stack.compute_dtype == torch.float32 for stack in (model._vlm, model._expert))
        attention = resolve_attention(attention, compiled=bool(compile) and use_graphs, float32=float32)
        if attention is not None:
            model.set_attention(attention)
        self.trim_prompt = check_trim_prompt(trim_prompt, int(lerobot_config.tokenizer_max_length))
        if self.trim_prompt and not (use_graphs or compile):
            raise ValueError(
                "trim_prompt pins the prompt's length for the CUDA graphs or the compiled shapes: "
                "it needs cuda_graphs or compile"
            )
        # graphs, or compiled without them (Inductor still fuses the elementwise chains): the chunk goes
        # through GraphedGenerate, whose batch buckets keep the compiled shapes to the warmed ones
        self.graphed = (
            GraphedGenerate(
                self.model,
                self.num_steps,
                compile=compile,
                trim_prompt=self.trim_prompt,
                graphs=use_graphs,
                compile_backend=compile_backend,
            )
            if use_graphs or compile
            else None
        )

    # --- construction ----------------------------------------------------------------------------
    @property
    def arch(self) -> Pi05Architecture:
        return self.model.arch

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @classmethod
    def from_pretrained(
        cls,
        ckpt_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        cuda_graphs: bool | None = None,
        precision: str = "mixed",
        compile: bool | str = False,
        trim_prompt: int = 0,
        attention: str = "auto",
        compile_backend: str = "inductor",
        allow_download: bool = False,
    ) -> Pi05Policy:
        """Load a LeRobot pi05 folder (see ``checkpoint``). ``dtype`` defaults to the config's ``dtype``;
        in bfloat16, ``precision="mixed"`` keeps the vision path, the norms and the action projections
        in float32 as LeRobot does (its numerics), ``"bf16"`` casts everything (fastest on a GPU),
        ``"fp8"`` is ``"bf16"`` with the VLM's and SigLIP's linear layers in FP8 (Hopper GPUs only;
        an accuracy trade, measured in docs/pi05.md; ``Pi05Model.to_fp8``).
        ``cuda_graphs`` (default: on for CUDA devices) replays prefix + flow steps as one graph;
        ``compile`` adds ``torch.compile`` under it, or alone without graphs (``true``, or an
        Inductor mode name such as ``"max-autotune-no-cudagraphs"``). ``trim_prompt=N`` (needs
        the graphs or ``compile``) cuts every prompt of up to N tokens to N before the model, the
        same outputs with less prefix (``trim_text``); longer prompts run at the tokenizer's full
        length. Both shapes are warmed up (``warmup_observations``) (docs/pi05.md). ``attention``:
        ``"sdpa"``, ``"math"`` (``Pi05Model.set_attention``) or ``"auto"``: math when compiled under
        the graphs (Inductor fuses it: 21.0 against 32.4 ms per chunk on an H200), SDPA otherwise. ``compile_backend``:
        torch.compile's backend (``eager``: the same tracing and guards without code generation, to
        check a server's recompilations quickly). ``allow_download``:
        fetch a tokenizer named by hub id that is not in the HF cache (never, by default)."""
        root = Path(ckpt_dir)
        check_folder(root)
        raw = read_config(root)
        arch = architecture_from_config(root, raw)
        check_processor_states(root, (PREPROCESSOR_FILE, POSTPROCESSOR_FILE))
        lr_config = _lerobot_config(root)
        tokenizer = find_tokenizer(root, allow_download)
        if len(tokenizer) > arch.vocab_size:
            raise CheckpointError(
                f"{root}: the tokenizer has {len(tokenizer)} tokens but the embedding only {arch.vocab_size}"
            )
        weights_dtype = torch_dtype(dtype if dtype is not None else raw.get("dtype", "float32"))
        with torch.device("meta"):
            model = Pi05Model(arch)
        if precision == "fp8":
            if weights_dtype != torch.bfloat16:
                raise ValueError(f"precision 'fp8' serves a bfloat16 model; got dtype {weights_dtype}")
            check_fp8_device(device)  # before gigabytes of weights are read
        load_weights(model, root / WEIGHTS_FILE, weights_dtype, precision)
        model.to(device)
        if precision == "fp8":
            model.to_fp8()
        lr_config.device = str(torch.device(device))
        from lerobot.policies.factory import make_pre_post_processors

        try:
            pre, post = make_pre_post_processors(
                lr_config,
                pretrained_path=str(root),
                preprocessor_overrides={
                    "tokenizer_processor": {"tokenizer": tokenizer},
                    "device_processor": {"device": str(torch.device(device))},
                },
            )
        except (OSError, ValueError, KeyError, FileNotFoundError) as exc:
            raise CheckpointError(f"{root}: LeRobot could not load the processor pipelines: {exc}") from exc
        return cls(
            model, lr_config, pre, post, tokenizer,
            cuda_graphs=cuda_graphs, compile=compile, trim_prompt=trim_prompt, attention=attention,
            compile_backend=compile_backend,
        )  # fmt: skip

    @classmethod
    def from_model(
        cls,
        model: Pi05Model,
        lerobot_config: Any,
        stats: Mapping[str, Mapping[str, Any]],
        tokenizer: Any,
        cuda_graphs: bool | None = None,
    ) -> Pi05Policy:
        """A policy around an in-memory model (SFT/RL, tests), with LeRobot's pi05 processors."""
        pre, post = build_processors(lerobot_config, stats, tokenizer)
        return cls(model, lerobot_config, pre, post, tokenizer, cuda_graphs=cuda_graphs)

    def save_pretrained(self, ckpt_dir: str | Path) -> Path:
        """Write the folder LeRobot writes (config, weights, processors) plus ``tokenizer/`` and, for
        non-released sizes, ``pi05_architecture.json``. The config records the denoising steps this
        policy samples with (RL may train with another number than the checkpoint it started from)."""
        root = Path(ckpt_dir)
        root.mkdir(parents=True, exist_ok=True)
        config = copy.copy(self.lerobot_config)
        config.num_inference_steps = self.num_steps
        config._save_pretrained(root)
        save_weights(self.model, root / WEIGHTS_FILE)
        self.preprocessor.save_pretrained(root)
        self.postprocessor.save_pretrained(root)
        tok_dir = root / TOKENIZER_DIR
        if tok_dir.exists():
            shutil.rmtree(tok_dir)
        self.tokenizer.save_pretrained(str(tok_dir))
        write_architecture(root, self.arch)
        return root

    # --- BasePolicy ------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        cfg = self.lerobot_config
        return {
            "type": "pi05",
            "action_horizon": int(cfg.n_action_steps),
            "chunk_size": int(cfg.chunk_size),
            "action_dim": self.action_dim,
            "action_space": {
                "dim": self.action_dim,
                "names": list(cfg.action_feature_names or []),
                "relative_to_state": bool(cfg.use_relative_actions),
            },
            "state_dim": self.state_dim,
            "cameras": list(self.camera_keys),
            "image_resolution": list(cfg.image_resolution),
            "num_flow_steps": self.num_steps,
            "expected_keys": self.io.expected_keys,
            **({"state_from": self.io.state_from} if self.io.state_from else {}),
        }

    def canonical(self, obs: Mapping[str, Any], index: int) -> dict[str, Any]:
        return self.io.canonical(obs, index)

    # --- the request path --------------------------------------------------------------------------
    def prepare(self, obs_batch: Sequence[Mapping[str, Any]]) -> Pi05Inputs:
        """Validate, rename, run LeRobot's preprocessor and build model inputs for a batch."""
        # cameras go to the device as uint8 and become floats there when LeRobot's preprocessor passes
        # them through (identity normalisation, pi05's default; its device step then finds them in place)
        visual = self.lerobot_config.normalization_mapping.get("VISUAL")
        on_device = str(getattr(visual, "value", visual)) == "IDENTITY"
        processed = self.preprocessor(self.io.batch(obs_batch, image_device=self.device if on_device else None))
        size = self.arch.vision.image_size
        dtype = self.model.action_in_proj.weight.dtype
        images, masks = [], []
        for key in self.camera_keys:
            img = processed[key].to(self.device, torch.float32)
            images.append((resize_with_pad(img, size) * 2.0 - 1.0).to(dtype))
            masks.append(torch.ones(img.shape[0], dtype=torch.bool, device=self.device))
        tokens = processed[TOKENS_KEY].to(self.device)
        token_mask = processed[TOKEN_MASK_KEY].to(self.device).bool()
        return Pi05Inputs(images, masks, tokens, token_mask)

    def serving_noise(self, batch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.serve_seed)
        one = torch.randn((1, self.arch.chunk_size, self.arch.max_action_dim), generator=gen)
        return one.expand(batch, -1, -1).to(self.device)

    def encode(self, inputs: Pi05Inputs) -> PrefixCache:
        x = inputs
        return self.model.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask, hidden=False)

    def denoise(self, cache: PrefixCache, noise: torch.Tensor) -> torch.Tensor:
        """Model-space chunks (B, chunk, max_action_dim) from the cached prefix; RL samplers override this."""
        return self.model.sample_actions(cache, noise, self.num_steps)

    def warmup_observations(self) -> list[dict[str, Any]]:
        """What ``serve --warmup`` runs at every batch size: the example observation and, with
        ``trim_prompt`` on, one whose prompt is longer than the pinned length, so both prompt shapes
        are compiled and captured before ``/readyz``."""
        example = self.example_observation()
        if not self.trim_prompt:
            return [example]
        long = dict(example)
        long[TASK_KEY] = " ".join(f"step {i}" for i in range(self.trim_prompt))
        if int(self.prepare([long]).token_mask.sum()) <= self.trim_prompt:
            raise RuntimeError(f"pi05 warm-up: could not build a prompt longer than trim_prompt={self.trim_prompt}")
        return [example, long]

    def graph_caches(self) -> list[GraphCache | None]:
        return [self.graphed.cache] if self.graphed is not None else []

    def renew_graph_caches(self) -> None:
        if self.graphed is not None:
            self.graphed = self.graphed.fresh()

    def generate(self, inputs: Pi05Inputs, noise: torch.Tensor) -> torch.Tensor:
        """Model-space chunks for prepared inputs: the captured graph on CUDA, else eager."""
        if self.graphed is not None and type(self).denoise is Pi05Policy.denoise:
            try:
                return self.graphed(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, noise)
            except GraphCaptureError as exc:  # keep serving: the eager path computes the same chunk
                log.error("pi05: %s; serving eagerly from now on", exc)
                self.graphed = None
        return self.denoise(self.encode(inputs), noise)

    def unnormalize(self, actions: torch.Tensor) -> np.ndarray:
        """(B, chunk, >= action_dim) model-space actions -> env units, first ``n_action_steps`` rows."""
        acts = actions[:, : self.lerobot_config.n_action_steps, : self.action_dim].float().cpu()
        out = self.postprocessor(acts)
        return np.asarray(out.float().numpy(), dtype=np.float32)

    def infer_batch(
        self, obs_batch: Sequence[dict[str, Any]], noise: torch.Tensor | None = None
    ) -> list[dict[str, Any]]:
        if not obs_batch:
            return []
        with torch.inference_mode():
            inputs = self.prepare(obs_batch)
            start = self.serving_noise(inputs.batch_size) if noise is None else noise.to(self.device)
            actions = self.unnormalize(self.generate(inputs, start.float()))
        return [{"actions": chunk} for chunk in actions]


def check_trim_prompt(value: Any, max_length: int) -> int:
    """``trim_prompt`` as a token count (0: off); anything else is an error that says what to give."""
    if value is False or value is None or value == 0:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < max_length:
        raise ValueError(
            f"trim_prompt={value!r}: give the prompt length in tokens to pin, between 1 and the tokenizer's "
            f"{max_length - 1} (e.g. -a trim_prompt=96: prompts up to 96 tokens run at 96, longer ones at "
            f"{max_length}; both are warmed up), or 0 for off"
        )
    return value


def _lerobot_config(root: Path) -> Any:
    """``config.json`` parsed by LeRobot's own ``PreTrainedConfig`` (the same class that wrote it)."""
    import lerobot.policies.pi05  # noqa: F401  registers the pi05 config choice
    from lerobot.configs.policies import PreTrainedConfig

    try:
        return PreTrainedConfig.from_pretrained(str(root), local_files_only=True)
    except Exception as exc:
        raise CheckpointError(f"{root / CONFIG_FILE}: LeRobot cannot parse it as a pi05 config: {exc}") from exc
