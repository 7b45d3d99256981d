"""The generation report: held-out prompts' samples before and after training, and reward histograms.

Every evaluation writes ``eval/step_XXXXXX.png`` (a grid of the held-out prompts' samples with fixed
noise, one cell per prompt, video frames side by side); ``report.html`` shows the first and the last
grid with their prompts, the held-out reward's curve and a histogram of per-prompt rewards before
and after. Self-contained: images are embedded as base64 PNG.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["save_grid", "write_report"]

COLS = 8


def grid(images: np.ndarray, cols: int = COLS) -> np.ndarray:
    """``(B, F, H, W, 3)`` uint8 -> one ``(rows * H, cols * F * W, 3)`` image (frames side by side)."""
    b, f, h, w, _ = images.shape
    rows = -(-b // cols)
    out = np.full((rows * h, cols * f * w, 3), 255, np.uint8)
    for i in range(b):
        r, c = divmod(i, cols)
        strip = np.concatenate(list(images[i]), axis=1)
        out[r * h : (r + 1) * h, c * f * w : (c + 1) * f * w] = strip
    return out


def save_grid(images: np.ndarray, path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid(images)).save(path)
    return path


def _png_b64(path: Path, scale: int = 2) -> str:
    from PIL import Image

    with Image.open(path) as src:
        img = src.resize((src.width * scale, src.height * scale), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure_b64(evals: list[dict[str, Any]], reward: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    ax1.plot([e["step"] for e in evals], [e["heldout_reward"] for e in evals], marker="o")
    ax1.set_xlabel("step")
    ax1.set_ylabel(f"held-out mean {reward}")
    first, last = np.asarray(evals[0]["scores"]), np.asarray(evals[-1]["scores"])
    bins = np.linspace(min(first.min(), last.min()), max(first.max(), last.max()) + 1e-9, 20)
    ax2.hist(first, bins=bins, alpha=0.6, label=f"step {int(evals[0]['step'])}")
    ax2.hist(last, bins=bins, alpha=0.6, label=f"step {int(evals[-1]['step'])}")
    ax2.set_xlabel(reward)
    ax2.set_ylabel("held-out prompts")
    ax2.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def write_report(run: Any, path: Path) -> Path:
    """``report.html`` of a finished run (``GenRun``): grids, prompts, curve, histograms."""
    evals, cfg = run.evals, run.config
    first, last = evals[0], evals[-1]
    cells = []
    for e in (first, last):
        png = run.out / "eval" / f"step_{int(e['step']):06d}.png"
        if png.exists():
            cells.append(
                f"<h3>step {int(e['step'])}: held-out mean {html.escape(cfg.reward.name)} "
                f"{e['heldout_reward']:.4f}</h3>"
                f'<img src="data:image/png;base64,{_png_b64(png)}">'
            )
    prompts = "".join(
        f"<li>{html.escape(p)}: {first['scores'][i]:.3f} &rarr; {last['scores'][i]:.3f}</li>"
        for i, p in enumerate(run.heldout)
    )
    body = (
        f"<h1>{html.escape(cfg.name)} ({cfg.trainer})</h1>"
        f"<p>init {html.escape(cfg.init)}; {cfg.shape.num_frames} frame(s) of {cfg.shape.height}x{cfg.shape.width}; "
        f"{cfg.sample.num_steps} sampling steps, guidance {cfg.sample.guidance}; {len(run.heldout)} held-out prompts "
        f"(grid cells in this order, row by row, the same noise at every step).</p>"
        + "".join(cells)
        + f'<img src="data:image/png;base64,{_figure_b64(evals, cfg.reward.name)}">'
        + f"<ol>{prompts}</ol>"
    )
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(cfg.name)}</title>"
                    f"</head><body style='font-family:sans-serif'>{body}</body></html>\n")  # fmt: skip
    return path
