"""Learning curves of several RL runs side by side: eval success and training success vs wall minutes.

    .venv/bin/python benchmarks/plot_rl_curves.py --out docs/img/rl_flow_tabletop.png \
        "joint PPO (CPU)=runs/joint_ppo_flow_tabletop" "GRPO (GPU)=runs/par_grpo" ...

Each run folder's ``metrics.jsonl`` gives ``eval_success`` (ODE, held-out layouts), ``train_success``
(the rollouts' own success, stochastic sampling) and ``wall_s``; training success is smoothed over
10 iterations. Also prints a table: start / best / last eval success, iterations, env steps, env steps/s.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def load(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fig, (ax_eval, ax_train) = plt.subplots(1, 2, figsize=(12, 4.2))
    print("| run | iterations | env steps | env steps/s | eval start | eval best | eval last |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for item in args.runs:
        label, _, path = item.partition("=")
        rows = load(Path(path))
        wall = 0.0
        evals, trains = [], []
        for r in rows:
            wall = r.get("wall_s", wall)
            if "eval_success" in r:
                evals.append((wall / 60, r["eval_success"]))
            if "train_success" in r:
                trains.append((wall / 60, r["train_success"]))
        line = ax_eval.plot([x for x, _ in evals], [y * 100 for _, y in evals], marker="o", ms=3, label=label)[0]
        k = 10
        smooth = [
            (
                trains[i][0],
                100 * sum(y for _, y in trains[max(0, i - k + 1) : i + 1]) / len(trains[max(0, i - k + 1) : i + 1]),
            )
            for i in range(len(trains))
        ]
        ax_train.plot([x for x, _ in smooth], [y for _, y in smooth], color=line.get_color(), label=label)
        steps = sum(r.get("env_steps", 0) for r in rows)
        iters = max((r["step"] for r in rows if "train_success" in r), default=0)
        rate = steps / max(wall, 1e-9)
        ev = [y for _, y in evals]
        pct = " | ".join(f"{100 * v:.1f}%" for v in (ev[0], max(ev), ev[-1])) if ev else "- | - | -"  # no eval.every
        print(f"| {label} | {iters} | {steps:,} | {rate:.0f} | {pct} |")
    ax_eval.set_title("eval success (ODE, held-out layouts)")
    ax_train.set_title("training success (stochastic rollouts, 10-iteration mean)")
    for ax in (ax_eval, ax_train):
        ax.set_xlabel("wall minutes")
        ax.set_ylabel("success %")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 100)
    ax_eval.legend(fontsize=8)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
