"""Learner throughput of data-parallel SFT at 1 and N processes (issue 22): samples per second of the same
recipe and global batch, through ``cosmos-robot train RECIPE --nproc N`` as a user launches it.

Why: data parallelism only pays when a step's compute outweighs the all-reduce and the replicated batch
assembly (docs/scale.md). Each case trains a few hundred steps; the rate is the median ``steps_per_s``
of the logged windows after the first (which holds start-up), times the global batch. On one machine
the processes share its cores, so each case also runs one process with as many threads as the N
processes have together: the fair single-process baseline.

    .venv/bin/python benchmarks/scale_sft.py                        # this CPU: 1 and 2 processes
    python benchmarks/scale_sft.py --nproc 1 2 4 --device cuda      # a multi-GPU machine (NCCL)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# recipe -> overrides that keep a case short and its data small
CASES: dict[str, list[str]] = {
    "sft_flow_tabletop": ["data.max_episodes_per_task=10", "eval.final=false", "eval.every=0"],
    "sft_qwen3_tiny_addition": ["eval.final=false", "eval.every=0"],
}


def run_case(recipe: str, extra: list[str], nproc: int, threads: int, steps: int, device: str, work: Path) -> dict:
    out = work / f"{recipe}_p{nproc}_t{threads}"
    every = max(1, steps // 5)
    sets = [
        f'output.dir="{out}"',
        f"train.steps={steps}",
        f"train.log_every={every}",
        f"train.ckpt_every={every * 5}",
        f"train.num_threads={threads}",
        f'train.device="{device}"',
        "train.progress=false",
        "output.plot=false",
        *extra,
    ]
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "train", recipe, f"--nproc={nproc}"]
    cmd += [f"--set={s}" for s in sets]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{recipe} --nproc {nproc}: exit {done.returncode}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [float(r["steps_per_s"]) for r in records if "steps_per_s" in r][1:]
    config = json.loads((out / "config.resolved.json").read_text())
    batch = int(config["train"]["batch_size"])
    steps_per_s = statistics.median(rates)
    return {"nproc": nproc, "threads_each": threads, "steps_per_s": round(steps_per_s, 2),
            "samples_per_s": round(steps_per_s * batch, 1), "batch": batch}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    report: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="scale_sft_") as tmp:
        for recipe in args.recipes:
            rows = []
            most = max(args.nproc)
            for nproc in args.nproc:
                # on the CPU, N processes of 1 thread against 1 process of N threads (the same cores)
                for threads in sorted({1, most // nproc} if args.device == "cpu" else {1}):
                    row = run_case(recipe, CASES[recipe], nproc, threads, args.steps, args.device, Path(tmp))
                    rows.append(row)
                    print(recipe, row, flush=True)
            report[recipe] = rows
    print("\n| recipe | processes | threads each | steps/s | samples/s |\n|---|---:|---:|---:|---:|")
    for recipe, rows in report.items():
        for r in rows:
            print(f"| {recipe} | {r['nproc']} | {r['threads_each']} | {r['steps_per_s']} | {r['samples_per_s']} |")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
