"""Tiny random Cosmos3 policy pipelines in diffusers' folder format, for tests and smoke runs.

The released Cosmos3 policies are billions of parameters and hub-hosted; this builds the same
pipeline classes (``Cosmos3OmniTransformer`` with the action head, a Wan2.2-shaped
``AutoencoderKLWan`` with the real 16x / 4x compression, a flow ``UniPCMultistepScheduler``, a
byte-level Qwen-style chat tokenizer) at a size a CPU runs in seconds, saves them with
``save_pretrained`` and adds ``cosmos_robot_policy.json`` naming the conventions.

    python -m cosmos_robot.policies.cosmos3.tiny OUT --embodiment droid
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["build_tiny_cosmos3", "build_tiny_pipeline", "chat_tokenizer"]

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=_CHAT_TEMPLATE
    )


def build_tiny_pipeline(seed: int = 0) -> Any:
    """A random ``Cosmos3OmniPipeline`` (about 0.3 M parameters) with the action head."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler

    torch.manual_seed(seed)
    transformer = Cosmos3OmniTransformer(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, latent_channel=4, latent_patch_size=2, patch_latent_dim=16, vocab_size=512,
        rope_axes_dim=[2, 1, 1], action_gen=True, action_dim=64, num_embodiment_domains=32,
    )  # fmt: skip
    with torch.no_grad():  # some heads start at zero; give every parameter signal
        for p in transformer.parameters():  # type: ignore[attr-defined]
            if p.abs().sum() == 0:
                p.normal_(0, 0.02)
    vae = AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], is_residual=True, patch_size=2, in_channels=12, out_channels=12,
        scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    )  # fmt: skip
    scheduler = UniPCMultistepScheduler(
        use_flow_sigmas=True, use_karras_sigmas=False, flow_shift=5.0, prediction_type="flow_prediction"
    )
    return Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=chat_tokenizer(),
        vae=vae,
        scheduler=scheduler,
        enable_safety_checker=False,
        default_use_system_prompt=False,
        use_native_flow_schedule=True,
    )


def build_tiny_cosmos3(
    out: str | Path, embodiment: str = "droid", settings: dict[str, Any] | None = None, seed: int = 0
) -> Path:
    """Save a tiny pipeline plus ``cosmos_robot_policy.json`` (and, for libero, a stats file)."""
    root = Path(out)
    build_tiny_pipeline(seed).save_pretrained(root)
    policy: dict[str, Any] = {"embodiment": embodiment, "settings": settings or {}}
    if embodiment == "libero":
        stats = {
            "global_raw": {
                "q01": [-0.9, -0.9, -0.9, -1, -1, -1, -1, -1, -1, 0.0],
                "q99": [0.9, 0.9, 0.9, 1, 1, 1, 1, 1, 1, 1.0],
            }
        }
        (root / "libero_native_frame_wise_relative_rot6d.json").write_text(json.dumps(stats, indent=2))
    (root / "cosmos_robot_policy.json").write_text(json.dumps(policy, indent=2))
    return root


def write_tiny(out: str | Path, seed: int = 0) -> Path:
    """The tiny Cosmos3 pipeline (DROID embodiment) written to ``out``."""
    return build_tiny_cosmos3(out, seed=seed)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="write a tiny random Cosmos3 policy pipeline (diffusers folder)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--embodiment", choices=["droid", "libero"], default="droid")
    args = ap.parse_args(argv)
    print(f"wrote {build_tiny_cosmos3(args.out, args.embodiment)}")


if __name__ == "__main__":
    main()
