"""Learner throughput of data-parallel training at 1 and N processes (issue 22): samples per second of the
same recipe and global batch, through ``cosmos-robot train RECIPE --nproc N`` as a user launches it.

Why: data parallelism only pays when a step's compute outweighs the all-reduce and the replicated batch
assembly (docs/scale.md). Each case trains a short run and reads its ``metrics.jsonl``:

- SFT (``sft_*``): the median ``steps_per_s`` of the logged windows after the first (which holds
  start-up), times the global batch;
- online RL (robot joint PPO, text GRPO): the learner's rate, the decisions (robot) or completions
  (text) an iteration trained on divided by its update phase's wall time (``time/update``; median
  over the iterations after the first), beside the whole iteration's rate (rollout included).

On one machine the processes share its cores, so each case also runs one process with as many
threads as the N processes have together: the fair single-process baseline.

    .venv/bin/python benchmarks/scale_learners.py                       # this CPU: 1 and 2 processes
    .venv/bin/python benchmarks/scale_learners.py --fsdp                # the N-process rows sharded (FSDP2)
    python benchmarks/scale_learners.py --nproc 1 2 4 --device cuda     # a multi-GPU machine (NCCL)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    """A recipe, how long a case runs (``length`` steps or iterations) and what keeps it short."""

    recipe: str
    kind: str  # "sft": steps x batch; "rl": trained samples / update wall time
    length: int
    extra: list[str] = field(default_factory=list)
    samples_key: str = "decisions"  # rl: the metric counting what an iteration trained on


CASES = {
    c.recipe: c
    for c in (
        Case("sft_flow_tabletop", "sft", 300, ["data.max_episodes_per_task=10", "eval.final=false", "eval.every=0"]),
        Case("sft_qwen3_tiny_addition", "sft", 300, ["eval.final=false", "eval.every=0"]),
        Case(
            "joint_ppo_flow_tabletop_state", "rl", 4,
            ["rollout.episodes_per_iter=64", "env.num_envs=4", "eval.every=0", "eval.final=false",
             "optim.minibatch_size=256"],
        ),
        # the tiny Qwen3 of debug_text_grpo at grpo_qwen3_tiny_addition's batch (which starts from an SFT run)
        Case(
            "debug_text_grpo", "rl", 6,
            ["rollout.prompts_per_iter=64", "rollout.group_size=8", "optim.minibatch_size=128",
             "algo.filter_groups=false", "eval.final=false", "eval.every=0"],
            "trained_completions",
        ),
    )
}  # fmt: skip


def _trainer_of(recipe: str) -> str:
    from cosmos_robot_trainers.launch import load_train_recipe

    return str(load_train_recipe(recipe)[0])


def run_case(case: Case, nproc: int, threads: int, device: str, work: Path, fsdp: bool = False) -> dict:
    """One row; ``fsdp``: the run shards its model (``train.fsdp``; a one-process run ignores it)."""
    out = work / f"{case.recipe}_p{nproc}_t{threads}{'_fsdp' if fsdp else ''}"
    if case.kind == "sft":
        every = max(1, case.length // 5)
        length = [f"train.steps={case.length}", f"train.log_every={every}", f"train.ckpt_every={every * 5}"]
    elif _trainer_of(case.recipe).startswith("text_"):  # text RL: train.steps counts iterations
        length = [f"train.steps={case.length}", "train.log_every=1", f"train.ckpt_every={case.length}"]
    else:
        length = [f"train.iterations={case.length}", f"train.ckpt_every={case.length}"]
    sets = [f'output.dir="{out}"', *length, f"train.num_threads={threads}", f'train.device="{device}"',
            "train.progress=false", "output.plot=false", *case.extra]  # fmt: skip
    sets += ["train.fsdp=true"] if fsdp else []
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "train", case.recipe, f"--nproc={nproc}"]
    cmd += [f"--set={s}" for s in sets]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{case.recipe} --nproc {nproc}: exit {done.returncode}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    row: dict = {"nproc": nproc, "threads_each": threads, **({"fsdp": True} if fsdp else {})}
    if case.kind == "sft":
        batch = int(json.loads((out / "config.resolved.json").read_text())["train"]["batch_size"])
        steps_per_s = statistics.median([float(r["steps_per_s"]) for r in records if "steps_per_s" in r][1:])
        row.update({"steps_per_s": round(steps_per_s, 2), "samples_per_s": round(steps_per_s * batch, 1)})
        return row
    iters = [r for r in records if "time/update" in r][1:]
    learner = statistics.median([float(r[case.samples_key]) / float(r["time/update"]) for r in iters])
    wall = [float(r.get("iter_wall_s") or sum(v for k, v in r.items() if k.startswith("time/"))) for r in iters]
    whole = statistics.median([float(r[case.samples_key]) / w for r, w in zip(iters, wall, strict=True)])
    row.update({"learner_samples_per_s": round(learner, 1), "iteration_samples_per_s": round(whole, 1)})
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--fsdp", action="store_true", help="shard the rows of more than one process (train.fsdp)")
    args = ap.parse_args(argv)
    report: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="scale_learners_") as tmp:
        for recipe in args.recipes:
            rows = []
            most = max(args.nproc)
            for nproc in args.nproc:
                # on the CPU, N processes of 1 thread against 1 process of N threads (the same cores)
                for threads in sorted({1, most // nproc} if args.device == "cpu" else {1}):
                    sharded = args.fsdp and nproc > 1
                    row = run_case(CASES[recipe], nproc, threads, args.device, Path(tmp), sharded)
                    rows.append(row)
                    print(recipe, row, flush=True)
            report[recipe] = rows
    print("\n| recipe | processes | threads each | rate |\n|---|---:|---:|---|")
    for recipe, rows in report.items():
        for r in rows:
            rate = {k: v for k, v in r.items() if k not in ("nproc", "threads_each", "fsdp")}
            shown = f"{r['nproc']} (fsdp)" if r.get("fsdp") else str(r["nproc"])
            print(f"| {recipe} | {shown} | {r['threads_each']} | {rate} |")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
