"""Held-out flow loss of fine-tuned checkpoints: the starting folder against the SFT result, on
demonstrations neither trained on (issue 21: "GR00T SFT lowers held-out loss").

Each checkpoint is scored by the SFT recipe's own loss (``sft.trainer.heldout_loss``: the family's
adapter, the loop's draws from a seeded generator, eval mode), on the same batches. Record held-out
demonstrations with other seeds first:

    cosmos-robot record --episodes-per-task 10 --seed 5000 --image-size 128 --out runs/demos/tabletop_heldout_s5000
    .venv/bin/python benchmarks/sft_heldout_loss.py --recipe sft_groot_tabletop \\
        --data runs/demos/tabletop_heldout_s5000 --ckpt tiny:groot --ckpt runs/sft_groot_tabletop/final
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True, help="the SFT recipe whose loss and [finetune] settings score")
    ap.add_argument("--data", required=True, type=Path, help="held-out LeRobotDataset folder")
    ap.add_argument("--ckpt", action="append", required=True, help="checkpoint folder or tiny:<family> (repeat)")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from cosmos_robot_trainers.launch import load_train_recipe
    from cosmos_robot_trainers.sft.trainer import heldout_loss

    rows = {}
    for ckpt in args.ckpt:
        overrides = [
            f"init={json.dumps(ckpt)}",
            f"data.root={json.dumps(str(args.data))}",
            "data.record_if_missing=false",
        ]
        _, config = load_train_recipe(args.recipe, overrides)
        rows[ckpt] = heldout_loss(config, batches=args.batches, batch_size=args.batch_size, log=lambda _: None)
        r = rows[ckpt]
        print(f"{ckpt}: held-out loss {r['loss']:.4f} +- {r['sem']:.4f} (s.e.m., {r['batches']} batches)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
