"""Tiny random GR00T N1.7 checkpoints built offline through LeRobot 0.6.1's own classes.

The released base (``nvidia/GR00T-N1.7-3B``, Cosmos-Reason2 / Qwen3-VL backbone) cannot be fetched
here, and LeRobot builds a GR00T policy from a base folder. This writes the three folders a real
setup has, at a size a 2-core CPU runs in tens of milliseconds, using only LeRobot's and
transformers' public constructors and ``save_pretrained`` (nothing patched):

- ``backbone/Qwen/Qwen3-VL-tiny/``: a Qwen3-VL config, a byte-level tokenizer with Qwen's special
  tokens and chat template, image and video processor configs (no weights: GR00T keeps the
  backbone's weights in its own checkpoint);
- ``base/``: a raw GR00T N1.7 checkpoint (``GR00TN17(config).save_pretrained``) plus the files
  LeRobot reads next to it: ``processor_config.json`` (modality config for ``libero_sim``),
  ``statistics.json`` and ``embodiment_id.json``;
- ``policy/``: ``GrootPolicy(GrootConfig(base_model_path=base, ...))`` and its processors, saved by
  LeRobot: the folder ``cosmos-robot serve --ckpt`` loads. Like every LeRobot GR00T folder it
  names its base by path (``base_model_path``), so the three folders travel together.

    python -m cosmos_robot.policies.groot.tiny OUT      # writes OUT/{backbone,base,policy}
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["SIZES", "GrootSize", "build_tiny_groot"]


@dataclass(frozen=True)
class GrootSize:
    """The shapes of one build: the Qwen3-VL backbone's text and vision towers and GR00T's own."""

    text: dict[str, Any]
    vision: dict[str, Any]
    base: dict[str, Any]  # GR00TN17Config fields (the rest: LeRobot's defaults, the released N1.7)
    image: int  # GR00T's image_target_size side
    max_dim: int  # max state/action dim
    chunk_size: int  # action rows per call (GR00T's action_horizon, LeRobot's chunk_size)
    vocab_size: int | None = None  # None: the built tokenizer's length


SIZES: dict[str, GrootSize] = {
    "tiny": GrootSize(
        text={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "mrope_section": [4, 2, 2]},
        vision={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        base={
            "select_layer": 2, "hidden_size": 64, "input_embedding_dim": 64, "max_seq_len": 64,
            "model_dtype": "float32", "dtype": "float32",
            "diffusion_model_cfg": {"positional_embeddings": None, "num_layers": 2, "num_attention_heads": 2,
                                    "attention_head_dim": 32, "norm_type": "ada_norm", "dropout": 0.0,
                                    "final_dropout": True, "output_dim": 64, "interleave_self_attention": True},
            "vl_self_attention_cfg": {"positional_embeddings": None, "num_layers": 1, "num_attention_heads": 2,
                                      "attention_head_dim": 32, "dropout": 0.0, "final_dropout": True},
        },
        image=64, max_dim=16, chunk_size=16,
    ),
    # GR00T N1.7-3B: Cosmos-Reason2-2B (Qwen3-VL-2B) cut at layer 16, LeRobot's default action head
    "released": GrootSize(
        text={"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "mrope_section": [24, 20, 20]},
        vision={"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17],
                "hidden_act": "gelu_pytorch_tanh"},
        base={"select_layer": 16},
        image=256, max_dim=132, chunk_size=40, vocab_size=151936,
    ),
}  # fmt: skip
STATE_GROUPS = {"x_y_z": 3, "roll_pitch_yaw": 3, "gripper": 2}  # LIBERO: eef pos, axis-angle, 2 finger joints
ACTION_GROUPS = {"x_y_z": 3, "roll_pitch_yaw": 3, "gripper": 1}  # delta pos, delta rot, gripper
VIDEO_KEYS = ["image", "wrist_image"]
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen3-VL's token layout for one user turn of images then text
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in item -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def _backbone(path: Path, size: GrootSize) -> Path:
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLProcessor, Qwen3VLVideoProcessor

    path.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vision = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
    pixels = {"size": {"shortest_edge": 32 * 32, "longest_edge": max(256, size.image) ** 2}}
    norm = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    image_processor = Qwen2VLImageProcessor(**vision, **pixels, **norm)
    video_processor = Qwen3VLVideoProcessor(**vision, **pixels, **norm)
    Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=tok, video_processor=video_processor, chat_template=CHAT_TEMPLATE
    ).save_pretrained(path)
    # LeRobot loads the components one by one, so they are also written in their own formats
    tok.save_pretrained(path)
    image_processor.save_pretrained(path)
    video_processor.save_pretrained(path)
    config: dict[str, Any] = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        text_config={
            "vocab_size": size.vocab_size or len(tok),
            **{k: v for k, v in size.text.items() if k != "mrope_section"},
            "max_position_embeddings": 2048,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": size.text["mrope_section"],  # sums to head_dim / 2
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": True,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            **size.vision,
            "out_hidden_size": size.text["hidden_size"],
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
        },
    )
    Qwen3VLConfig(**config).save_pretrained(path)
    return path


def _group_stats(dim: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    lo, hi = rng.uniform(-2, -0.5, dim), rng.uniform(0.5, 2, dim)
    return {"min": (lo * 1.2).tolist(), "max": (hi * 1.2).tolist(), "mean": ((lo + hi) / 2).tolist(),
            "std": ((hi - lo) / 4).tolist(), "q01": lo.tolist(), "q99": hi.tolist()}  # fmt: skip


def _base(path: Path, backbone: Path, seed: int, size: GrootSize) -> Path:
    from lerobot.policies.groot.groot_n1_7 import GR00TN17, GR00TN17Config

    path.mkdir(parents=True, exist_ok=True)
    img = size.image
    config = GR00TN17Config(
        model_name=str(backbone),
        backbone_model_type="qwen",
        backbone_embedding_dim=size.text["hidden_size"],
        max_state_dim=size.max_dim,
        max_action_dim=size.max_dim,
        action_horizon=size.chunk_size,
        max_num_embodiments=32,
        image_target_size=[img, img],
        image_crop_size=[int(img * 0.9), int(img * 0.9)],
        num_inference_timesteps=4,
        **size.base,
    )
    torch.manual_seed(seed)
    GR00TN17(config, load_backbone_weights=False).save_pretrained(path)
    modality = {
        "video": {"delta_indices": [0], "modality_keys": VIDEO_KEYS},
        "state": {"delta_indices": [0], "modality_keys": list(STATE_GROUPS)},
        "action": {
            "delta_indices": list(range(size.chunk_size)),
            "modality_keys": list(ACTION_GROUPS),
            "action_configs": [{"rep": "absolute", "type": "non_eef", "format": "default"} for _ in ACTION_GROUPS],
        },
        "language": {"delta_indices": [0], "modality_keys": ["annotation.human.task_description"]},
    }
    processor = {
        "processor_class": "Gr00tN1d7Processor",
        "processor_kwargs": {
            "modality_configs": {"libero_sim": modality},
            "image_crop_size": [int(img * 0.9), int(img * 0.9)],
            "image_target_size": [img, img],
            "shortest_image_edge": None,
            "crop_fraction": None,
            "use_albumentations": False,
            "letter_box_transform": False,
            "formalize_language": True,
            "use_percentiles": True,
            "use_relative_action": False,
            "clip_outliers": True,
            "state_dropout_prob": 0.0,
            "max_action_horizon": size.chunk_size,
            "max_state_dim": size.max_dim,
            "max_action_dim": size.max_dim,
        },
    }
    (path / "processor_config.json").write_text(json.dumps(processor, indent=2))
    stats = {
        "libero_sim": {
            "state": {k: _group_stats(d, i) for i, (k, d) in enumerate(STATE_GROUPS.items())},
            "action": {k: _group_stats(d, 10 + i) for i, (k, d) in enumerate(ACTION_GROUPS.items())},
        }
    }
    (path / "statistics.json").write_text(json.dumps(stats, indent=2))
    (path / "embodiment_id.json").write_text(json.dumps({"libero_sim": 2, "new_embodiment": 10}, indent=2))
    return path


def build_tiny_groot(
    out: str | Path, seed: int = 0, n_action_steps: int = 8, scale: float = 0.05, size: str = "tiny"
) -> Path:
    """Write ``out/{backbone,base,policy}``; returns the policy folder (``serve --ckpt`` takes it).

    ``size="released"`` builds GR00T N1.7-3B's shapes (random weights, for GPU benchmarks; several
    GB on disk, and LeRobot's own initialisation is kept instead of re-drawing every weight)."""
    shape = SIZES[size]
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.groot import GrootConfig, GrootPolicy

    root = Path(out)
    backbone = _backbone(root / "backbone" / "Qwen" / f"Qwen3-VL-{size}", shape)  # a Qwen/Qwen3-VL path: no warning
    base = _base(root / "base", backbone, seed, shape)
    config = GrootConfig(
        base_model_path=str(base),
        embodiment_tag="libero_sim",
        device="cpu",
        use_bf16=size != "tiny",
        chunk_size=shape.chunk_size,
        n_action_steps=n_action_steps,
        max_state_dim=shape.max_dim,
        max_action_dim=shape.max_dim,
        input_features={
            "observation.images.image": PolicyFeature(FeatureType.VISUAL, (3, 224, 224)),
            "observation.images.wrist_image": PolicyFeature(FeatureType.VISUAL, (3, 224, 224)),
            "observation.state": PolicyFeature(FeatureType.STATE, (sum(STATE_GROUPS.values()),)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (sum(ACTION_GROUPS.values()),))},
    )
    policy = GrootPolicy(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # random everywhere (zero-initialised layers would hide wiring mistakes)
        for p in policy.parameters() if size == "tiny" else ():
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    # LeRobot's GR00T processor names the released backbone for its VLM step; point it at ours
    overrides = {"groot_n1_7_vlm_encode_v1": {"model_name": str(backbone)}}
    pre, post = make_pre_post_processors(config, pretrained_path=str(base), preprocessor_overrides=overrides)
    folder = root / "policy"
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    return folder


def write_tiny(out: str | Path, seed: int = 0) -> Path:
    """The tiny GR00T under ``out`` (``out/{backbone,base,policy}``); returns the policy folder."""
    return build_tiny_groot(out, seed)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="write a tiny random GR00T N1.7 checkpoint (LeRobot folders)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny", help="released: GR00T N1.7-3B's shapes")
    args = ap.parse_args(argv)
    print(f"wrote {build_tiny_groot(args.out, args.seed, size=args.size)}")


if __name__ == "__main__":
    main()
