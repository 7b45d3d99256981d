"""GR00T N1.7 action-head SFT step time with cached against recomputed backbone features (issue 21).

One SFT run per mode through ``cosmos-robot train``'s own code (``run_sft`` of ``debug_sft_groot``
with ``init`` swapped): ``finetune.feature_cache = "on"`` (the frozen backbone's output computed once
per frame, batches gather it) and ``"off"`` (LeRobot's preprocessor and the backbone on every batch).
Reports steps/s over the run's last logging window (after the first, which includes warm-up) and
the data-preparation time (loading, preprocessing, and for ``on`` the cache).

    python benchmarks/groot_sft_step.py --size released --device cuda --steps 60 --batch 32   # H200
    .venv/bin/python benchmarks/groot_sft_step.py --size tiny --steps 20 --batch 8           # CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "released"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--data", type=Path, default=None, help="a recorded LeRobotDataset (default: record 2 per task)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from cosmos_robot.policies.groot.tiny import build_tiny_groot
    from cosmos_robot_trainers.common import read_metrics
    from cosmos_robot_trainers.launch import load_train_recipe
    from cosmos_robot_trainers.sft import run_sft

    work = args.work or Path(tempfile.mkdtemp(prefix="groot_sft_step_"))
    t0 = time.perf_counter()
    folder = build_tiny_groot(work / "groot", size=args.size)
    built_s = time.perf_counter() - t0
    data = args.data or work / "demos"
    every = max(1, args.steps // 2)
    rows: dict[str, dict[str, float]] = {}
    for mode in ("on", "off"):
        out = work / f"run_{mode}"
        _, config = load_train_recipe(
            "debug_sft_groot",
            [
                f"init={json.dumps(str(folder))}",
                f"data.root={json.dumps(str(data))}",
                f"output.dir={json.dumps(str(out))}",
                f"finetune.feature_cache={json.dumps(mode)}",
                "augment.random_shift=0",
                f"train.steps={args.steps}",
                f"train.batch_size={args.batch}",
                f"train.log_every={every}",
                f"train.ckpt_every={every * 1000}",
                f"train.device={json.dumps(args.device)}",
                f"train.num_threads={os.cpu_count() or 1}",
                "train.progress=false",
            ],
        )
        t1 = time.perf_counter()
        result = run_sft(config, log=lambda _: None)
        records = read_metrics(out)
        rows[mode] = {
            "steps_per_s_last_window": float(records[-1]["steps_per_s"]),
            "train_wall_s": round(result.train_wall_s, 2),
            "data_and_train_s": round(time.perf_counter() - t1, 2),
        }
        print(mode, rows[mode], flush=True)
        # a run's checkpoints hold the whole model: at the released shape tens of GB per run, which filled
        # the H200 machine's 64 GiB disk before the second mode (2026-12-04)
        shutil.rmtree(out)
    speedup = rows["on"]["steps_per_s_last_window"] / rows["off"]["steps_per_s_last_window"]
    report = {"size": args.size, "device": args.device, "batch": args.batch, "built_s": round(built_s, 1),
              "rows": rows, "cached_over_recomputed": round(speedup, 2)}  # fmt: skip
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    if args.work is None:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
