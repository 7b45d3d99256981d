"""The learning curve of a run as a PNG, drawn from ``metrics.jsonl`` (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cosmos_robot_trainers.common.metrics import read_metrics

__all__ = ["plot_learning_curve"]


def plot_learning_curve(
    run_dir: str | Path, keys: Sequence[str] = ("loss", "lr"), out: str | Path | None = None
) -> Path | None:
    """Plot ``keys`` against ``step``, one panel each (log y for positive series spanning > 50x); None if no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    present = [k for k in keys if any(k in r for r in records)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.6 * len(present)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], present):
        pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, lw=1.2)
        if ys and min(ys) > 0 and max(ys) / min(ys) > 50:
            ax.set_yscale("log")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    path = Path(out) if out is not None else run_dir / "learning_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
