"""A tiny Cosmos3 text-to-image/video pipeline whose VAE is pretrained on procedural shapes.

The released Cosmos3 generators are billions of parameters on the hub. This writes the same diffusers
folder (``Cosmos3OmniPipeline``: ``Cosmos3OmniTransformer`` without the action head, a Wan2.2-shaped
``AutoencoderKLWan`` with the real 16x spatial / 4x temporal compression, the flow UniPC scheduler, a
byte-level chat tokenizer) at a size this CPU trains in minutes, with one difference from a random
pipeline: the VAE is first trained to reconstruct ``shapes`` scenes (images and 5-frame clips), and
its ``latents_mean`` / ``latents_std`` are set from the data, as Wan's are. A random VAE barely lets
latents change the decoded image's statistics; this one decodes latents into shapes and colours, so
rewards on the pixels (brightness, colour match, JPEG size) respond to what the transformer generates.

    python -m cosmos_robot.generation.tiny OUT [--vae-steps 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.generation.shapes import scene_batch

__all__ = ["build_tiny_generator", "pretrain_vae", "tiny_transformer", "tiny_vae"]

Z_DIM = 8


def tiny_vae(seed: int = 0, z_dim: int = Z_DIM) -> Any:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=16, decoder_base_dim=16, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], is_residual=True, patch_size=2, in_channels=12, out_channels=12,
        scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    )  # fmt: skip


def tiny_transformer(seed: int = 0, z_dim: int = Z_DIM, hidden: int = 64, layers: int = 4) -> Any:
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(seed)
    return Cosmos3OmniTransformer(
        hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=hidden // 4, latent_channel=z_dim, latent_patch_size=2,
        patch_latent_dim=z_dim * 4, vocab_size=512, rope_axes_dim=[hidden // 32, hidden // 64, hidden // 64],
        dtype="float32",
    )  # fmt: skip


def pretrain_vae(
    vae: Any,
    steps: int,
    seed: int = 0,
    size: int = 64,
    lr: float = 2e-3,
    log: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Train ``vae`` to reconstruct shapes scenes (3 image batches of 16 per 5-frame batch of 4; MSE plus a
    1e-6 KL), then set its latent statistics from 256 held-out images. Returns the held-out MSE."""
    opt = torch.optim.AdamW(vae.parameters(), lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    rng = np.random.default_rng(seed)
    vae.train()
    start = time.monotonic()
    for step in range(steps):
        frames = 5 if step % 4 == 3 else 1
        x = torch.from_numpy(scene_batch(rng, 16 if frames == 1 else 4, size, frames)[0])
        post = vae.encode(x).latent_dist
        loss = torch.nn.functional.mse_loss(vae.decode(post.sample()).sample, x) + 1e-6 * post.kl().mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        if log and (step % 250 == 0 or step == steps - 1):
            log(f"vae step {step + 1}/{steps}: loss {loss.item():.4f} ({time.monotonic() - start:.0f} s)")
    vae.eval()
    held = torch.from_numpy(scene_batch(np.random.default_rng(seed + 10_000), 256, size, 1)[0])
    with torch.no_grad():
        mu = torch.cat([vae.encode(held[i : i + 64]).latent_dist.mode() for i in range(0, 256, 64)])
        rec = torch.cat([vae.decode(mu[i : i + 64]).sample for i in range(0, 256, 64)])
    mean = mu.mean(dim=(0, 2, 3, 4))
    std = mu.std(dim=(0, 2, 3, 4)).clamp(min=1e-3)
    vae.register_to_config(latents_mean=[float(v) for v in mean], latents_std=[float(v) for v in std])
    return {"heldout_mse": float(torch.nn.functional.mse_loss(rec, held)), "train_s": time.monotonic() - start}


def build_tiny_generator(
    out: str | Path, vae_steps: int = 2000, seed: int = 0, log: Callable[[str], None] | None = None
) -> Path:
    """Write the pipeline folder (pretrained VAE, random transformer) to ``out``; returns it."""
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    from cosmos_robot.policies.cosmos3.tiny import chat_tokenizer

    vae = tiny_vae(seed)
    facts = pretrain_vae(vae, vae_steps, seed=seed, log=log) if vae_steps > 0 else {}
    pipe: Any = Cosmos3OmniPipeline(
        transformer=tiny_transformer(seed),
        text_tokenizer=chat_tokenizer(),
        vae=vae,
        scheduler=UniPCMultistepScheduler(
            use_flow_sigmas=True, use_karras_sigmas=False, flow_shift=3.0, prediction_type="flow_prediction"
        ),
        enable_safety_checker=False,
        default_use_system_prompt=False,
        use_native_flow_schedule=True,
    )
    root = Path(out)
    pipe.save_pretrained(root)
    if log and facts:
        log(f"vae: held-out reconstruction MSE {facts['heldout_mse']:.4f} after {vae_steps} steps")
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="write a tiny Cosmos3 T2I/T2V pipeline with a shapes-pretrained VAE")
    ap.add_argument("out", type=Path)
    ap.add_argument("--vae-steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"wrote {build_tiny_generator(args.out, args.vae_steps, args.seed, log=print)}")


if __name__ == "__main__":
    main()
