"""Held-out reward gain of a generator recipe over training seeds, against the seed-to-seed spread.

Runs the recipe once per seed (or, with ``--summarize-only``, reads runs already made) and reports
the held-out mean reward of every evaluation of every run, the mean gain over the start, the spread
(sample standard deviation over seeds of the final held-out reward) and their ratio; writes a plot
of the curves. Issue 23's gate: gain >= 3x spread.

    python benchmarks/generator_seeds.py nft_cosmos3_t2i_shapes --seeds 0 1 2 --threads 1 --parallel \\
        --plot docs/img/generator_nft_seeds.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def run_dir(recipe: str, seed: int) -> Path:
    return Path("runs") / f"{recipe}_seed{seed}"


def launch(recipe: str, seeds: list[int], threads: int, parallel: bool) -> None:
    procs = []
    for seed in seeds:
        cmd = [sys.executable, "-m", "cosmos_robot.cli", "train", recipe, "--set", f"train.seed={seed}",
               "--set", f"train.num_threads={threads}", "--set", f'output.dir="{run_dir(recipe, seed)}"']  # fmt: skip
        proc = subprocess.Popen(cmd, env=os.environ | {"HF_HUB_OFFLINE": "1"})
        if parallel:
            procs.append(proc)
        elif proc.wait() != 0:
            raise SystemExit(f"{' '.join(cmd)} failed")
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a seed's run failed")


def summarize(runs: dict[int, Path], plot: Path | None) -> dict[str, float]:
    curves = {}
    for seed, path in runs.items():
        rows = [json.loads(line) for line in (path / "evals.jsonl").read_text().splitlines()]
        curves[seed] = [(int(r["step"]), float(r["heldout_reward"])) for r in rows]
    start = float(np.mean([c[0][1] for c in curves.values()]))
    finals = np.array([c[-1][1] for c in curves.values()])
    gain, spread = float(finals.mean() - start), float(finals.std(ddof=1)) if len(finals) > 1 else 0.0
    out = {"start": start, "final_mean": float(finals.mean()), "gain": gain, "spread": spread,
           "gain_over_spread": gain / spread if spread > 0 else float("inf")}  # fmt: skip
    for seed, c in curves.items():
        print(f"seed {seed}: " + ", ".join(f"{s}: {v:.4f}" for s, v in c))
    print(json.dumps(out, indent=2))
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.4))
        for seed, c in curves.items():
            ax.plot([s for s, _ in c], [v for _, v in c], marker="o", label=f"seed {seed}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("held-out mean reward")
        ax.legend()
        fig.tight_layout()
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=100)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", action="store_true", help="run the seeds at once (each with --threads)")
    ap.add_argument("--summarize-only", action="store_true", help="read runs/<recipe>_seed<N> without training")
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.summarize_only:
        launch(args.recipe, args.seeds, args.threads, args.parallel)
    summarize({s: run_dir(args.recipe, s) for s in args.seeds}, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
