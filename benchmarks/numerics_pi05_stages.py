"""Where our float32 pi0.5 first departs from LeRobot's: stage by stage on the same folder and inputs.

Why (issue 19): on the CPU (tiny sizes) our float32 chunk is bitwise LeRobot's; on the H200 at the
released shapes it differed by 2.4e-3 mean against a 7.1e-5 floor (LeRobot against itself at another
batch size), with every attention variant. This prints the largest absolute difference of each
stage, in the order the model computes them, so the first non-zero row names the op to look at:
preprocessed images and tokens, the prefix embeddings, each VLM layer's keys and values (from our
embeddings, then again from LeRobot's, which tells the layers from their input), one flow-step velocity
from the same cache, and the whole chunk.

    python benchmarks/numerics_pi05_stages.py --size full --device cuda     # H200
    .venv/bin/python benchmarks/numerics_pi05_stages.py --size tiny          # CPU: all rows 0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_pi05 as parity


def stages(size: str, device: str, batch: int, seed: int) -> dict[str, float]:
    from lerobot.policies.pi05.modeling_pi05 import make_att_2d_masks, prepare_attention_masks_4d

    from cosmos_robot.policies.pi05.policy import Pi05Policy

    rows: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "pi05"
        folder.mkdir()
        ref, pre, _post = parity.build_reference(size, folder, device, "float32", seed)
        ref.eval()
        ours = Pi05Policy.from_pretrained(folder, device=device, dtype="float32", cuda_graphs=False)
        print("our attention:", ours.model.attention, flush=True)
        obs = parity.observations(batch, seed)
        raw = {
            "observation.images.image": torch.stack([parity._chw(o["observation/image"]) for o in obs]),
            "observation.images.image2": torch.stack([parity._chw(o["observation/wrist_image"]) for o in obs]),
            "observation.state": torch.from_numpy(np.stack([o["observation/state"] for o in obs])),
            "task": [o["prompt"] for o in obs],
        }
        m = ref.model

        def diff(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
            rows[name] = float((a.float() - b.float()).abs().max())
            print(f"{name:40s} {rows[name]:.3e}", flush=True)

        with torch.no_grad():
            processed = pre(raw)
            images, img_masks = ref._preprocess_images(processed)
            tokens = processed["observation.language.tokens"]
            masks = processed["observation.language.attention_mask"]
            x = ours.prepare(obs)
            for i, (a, b) in enumerate(zip(images, x.images, strict=True)):
                diff(f"image {i}", a, b)
            diff("tokens", tokens, x.tokens)
            vis_ref = m.paligemma_with_expert.embed_image(images[0])
            diff("image 0 embedding (SigLIP + projector)", vis_ref, ours.model.embed_images(x.images[0]))
            e1, p1, a1 = m.embed_prefix(images, img_masks, tokens, masks)
            e2, _p2 = ours.model.embed_prefix(x.images, x.image_masks, x.tokens, x.token_mask)
            diff("prefix embeddings", e1, e2)
            pos = torch.cumsum(p1, dim=1) - 1
            m.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"
            _, pkv = m.paligemma_with_expert.forward(
                attention_mask=prepare_attention_masks_4d(make_att_2d_masks(p1, a1)),
                position_ids=pos,
                past_key_values=None,
                inputs_embeds=[e1, None],
                use_cache=True,
            )
            cache = ours.model.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask)
            for i in range(len(cache.keys)):
                layer = pkv.layers[i]
                diff(f"layer {i:2d} keys", layer.keys, cache.keys[i])
                diff(f"layer {i:2d} values", layer.values, cache.values[i])
            # our layers on LeRobot's own prefix embeddings: separates the language model's layers from
            # what enters them (one batched SigLIP call for both cameras against one call per camera)
            ours_embed = ours.model.embed_prefix
            ours.model.embed_prefix = lambda *_: (e1, _p2)  # type: ignore[method-assign]
            try:
                same_in = ours.model.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask)
            finally:
                ours.model.embed_prefix = ours_embed  # type: ignore[method-assign]
            for i in range(len(same_in.keys)):
                layer = pkv.layers[i]
                diff(f"layer {i:2d} keys, LeRobot's embeddings in", layer.keys, same_in.keys[i])
                diff(f"layer {i:2d} values, LeRobot's embeddings in", layer.values, same_in.values[i])
            gen = torch.Generator().manual_seed(seed + 3)
            x_t = torch.randn((batch, ref.config.chunk_size, ref.config.max_action_dim), generator=gen).to(device)
            t = torch.full((batch,), 0.7, device=device)
            diff("velocity at t=0.7, same inputs", m.denoise_step(p1, pkv, x_t, t), ours.model.velocity(cache, x_t, t))
            noise = torch.randn(x_t.shape, generator=gen).to(device)
            a_ref = m.sample_actions(images, img_masks, tokens, masks, noise=noise.clone())
            diff("chunk (model space)", a_ref, ours.model.sample_actions(cache, noise.clone(), ours.num_steps))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = stages(args.size, args.device, args.batch, args.seed)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
