"""The run's report: ``results.json`` for machines, ``report.html`` (+ PNG charts) for people.

Why both: CI and sweeps diff numbers, people look at bars and videos. The HTML is one file that
opens from disk with no server and no JavaScript: the charts are inlined as base64 PNG (and also
saved beside it), the videos are ``<video>`` tags with paths relative to the report, so the output
folder can be copied or published as a whole.

Charts use matplotlib's object API with the Agg canvas (no pyplot global state, no display).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_robot_envs.eval.records import EpisodeRecord

__all__ = ["LATENCY_PNG", "REPORT_HTML", "RESULTS_JSON", "SUCCESS_PNG", "write_report"]

RESULTS_JSON = "results.json"
REPORT_HTML = "report.html"
SUCCESS_PNG = "success_rate.png"
LATENCY_PNG = "latency_hist.png"


def _png(fig: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def success_chart(tasks: dict[str, Any]) -> bytes:
    """Bar per task: success rate with its Wilson 95 % interval as error bars."""
    from matplotlib.figure import Figure

    names = list(tasks)
    rates = np.array([tasks[t]["success_rate"] for t in names])
    lo = np.array([tasks[t]["ci95_low"] for t in names])
    hi = np.array([tasks[t]["ci95_high"] for t in names])
    fig = Figure(figsize=(max(4.0, 1.2 * len(names) + 1.5), 3.2))
    ax = fig.add_subplot()
    x = np.arange(len(names))
    ax.bar(x, 100 * rates, color="#4c72b0")
    yerr = np.stack([100 * (rates - lo), 100 * (hi - rates)])  # a (2, N) array: a list of arrays warns on numpy 2
    ax.errorbar(x, 100 * rates, yerr=yerr, fmt="none", ecolor="black", capsize=4)
    ax.set_xticks(x, names)
    ax.set_ylim(0, 105)
    ax.set_ylabel("success rate (%)")
    ax.set_title("success per task (Wilson 95 % CI)")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def latency_chart(latencies_ms: Sequence[float]) -> bytes:
    """Histogram of the chunk-query latencies every episode waited for."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 3.2))
    ax = fig.add_subplot()
    if latencies_ms:
        ax.hist(latencies_ms, bins=min(50, max(5, len(latencies_ms) // 5)), color="#55a868")
        p50, p95 = np.percentile(latencies_ms, [50, 95])
        ax.axvline(p50, color="black", linestyle="--", linewidth=1, label=f"p50 {p50:.1f} ms")
        ax.axvline(p95, color="#c44e52", linestyle=":", linewidth=1.5, label=f"p95 {p95:.1f} ms")
        ax.legend(fontsize=8)
    ax.set_xlabel("inference latency per chunk query (ms)")
    ax.set_ylabel("queries")
    ax.set_title("inference latency")
    return _png(fig)


def _table(results: dict[str, Any]) -> str:
    rows = []
    for task, s in results["tasks"].items():
        rows.append(
            f"<tr><td>{html.escape(task)}</td><td>{s['successes']}/{s['episodes']}</td>"
            f"<td>{100 * s['success_rate']:.1f}%</td><td>[{100 * s['ci95_low']:.1f}%, {100 * s['ci95_high']:.1f}%]</td>"
            f"<td>{s['mean_steps']:.1f}</td><td>{s['truncated']}</td>"
            f"<td>{s.get('infra_failures', 0)}</td><td>{s.get('missing', 0)}</td></tr>"
        )
    t = results["totals"]
    rows.append(
        f"<tr class='total'><td>total</td><td>{t['successes']}/{t['episodes']}</td>"
        f"<td>{100 * t['success_rate']:.1f}%</td><td>[{100 * t['ci95_low']:.1f}%, {100 * t['ci95_high']:.1f}%]</td>"
        f"<td></td><td>{sum(t['truncated_reasons'].values())}</td>"
        f"<td>{t.get('infra_failures', 0)}</td><td>{t.get('missing', 0)}</td></tr>"
    )
    names = ("task", "successes", "rate", "95% CI (Wilson)", "mean steps", "truncated", "infra failures", "missing")
    head = "<tr>" + "".join(f"<th>{n}</th>" for n in names) + "</tr>"
    return f"<table id='summary'>{head}{''.join(rows)}</table>"


def _videos(records: Sequence[EpisodeRecord]) -> str:
    items = []
    for r in records:
        if r.video is None:
            continue
        label = f"{r.task} #{r.episode} (seed {r.seed}): {'success' if r.success else 'failure'}, {r.steps} steps"
        items.append(
            f"<figure><video src='{html.escape(r.video)}' controls muted loop playsinline width='256'></video>"
            f"<figcaption>{html.escape(label)}</figcaption></figure>"
        )
    return "<div class='videos'>" + "".join(items) + "</div>" if items else "<p>no videos recorded</p>"


def _failures(results: dict[str, Any]) -> str:
    """Per task, the seeds of the episodes the policy failed (to replay them) and lost episodes."""
    items = []
    for task, s in results["tasks"].items():
        seeds = s.get("failed_seeds", [])
        infra = s.get("infra_failures", 0)
        if not seeds and not infra and not s.get("missing"):
            continue
        text = f"<b>{html.escape(task)}</b>: "
        text += f"seeds {', '.join(str(x) for x in seeds)}" if seeds else "no policy failure"
        if infra:
            text += (
                f"; {infra} attempt(s) lost to a crashed or hung simulator worker (retried with the same seed, "
                "not counted as the policy's)"
            )
        if s.get("missing"):
            text += f"; {s['missing']} episode(s) missing: rerun the same command to complete them"
        items.append(f"<li>{text}</li>")
    return f"<ul id='failures'>{''.join(items)}</ul>" if items else "<p>no failed episodes</p>"


def _header(results: dict[str, Any]) -> list[str]:
    cfg, pol = results["config"], results["policy"]
    family = f" ({html.escape(str(pol['family']))})" if pol.get("family") else ""
    done = sum(s["episodes"] for s in results["tasks"].values())
    status = (
        "complete"
        if results.get("complete")
        else f"incomplete: {done} of {results.get('episodes_scheduled', '?')} episodes recorded "
        "(rerun the same command to complete it)"
    )
    version = results.get("versions", {}).get("cosmos-robot-envs", "unknown")
    return [
        f"<h1>cosmos-robot eval: {html.escape(cfg['suite'])}</h1>",
        f"<p>checkpoint <code>{html.escape(str(pol.get('checkpoint', pol['source'])))}</code>{family}, "
        f"policy <code>{html.escape(pol['source'])}</code> ({html.escape(pol['kind'])}).</p>",
        f"<p>{cfg['episodes_per_task']} episodes per task, seed {cfg['seed']}, replan every {cfg['replan_steps']} "
        f"steps, {cfg['num_envs']} envs ({html.escape(cfg['vector_mode'])}). Run <b id='status'>{status}</b>; "
        f"report created {html.escape(str(results.get('created_at', '?')))} by cosmos-robot-envs "
        f"{html.escape(version)}.</p>",
    ]


def _throughput(results: dict[str, Any]) -> str:
    thr = results["throughput"]
    if not thr.get("requests"):
        return "no episode ran in this invocation, so no throughput was measured."
    when = thr.get("measured_at")
    run = "this run" if when in (None, results.get("created_at")) else f"in the run of {html.escape(str(when))}"
    return (
        f"{thr['episodes_per_min']:.1f} episodes/min {run} "
        f"({thr['requests']} requests, mean {thr['mean_request_batch']:.2f} observations each)."
    )


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{alt}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child{text-align:left}"
    "tr.total{font-weight:bold}.videos{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}"
    "figcaption{font-size:12px}pre{background:#f5f5f5;padding:8px;overflow:auto}"
)


def write_report(out_dir: Path, results: dict[str, Any], records: Sequence[EpisodeRecord]) -> None:
    """Write ``results.json``, the two PNG charts and ``report.html`` into ``out_dir``."""
    (out_dir / RESULTS_JSON).write_text(json.dumps(results, indent=2, sort_keys=False, allow_nan=False) + "\n")
    success_png = success_chart(results["tasks"])
    latency_png = latency_chart([x for r in records for x in r.latencies_ms])
    (out_dir / SUCCESS_PNG).write_bytes(success_png)
    (out_dir / LATENCY_PNG).write_bytes(latency_png)
    lat = results["latency_ms"]
    body = [
        *_header(results),
        "<h2>Success</h2>",
        _table(results),
        _img(success_png, "success rate per task"),
        "<h2>Failed episodes</h2>",
        _failures(results),
        "<h2>Inference latency</h2>",
        f"<p>p50 {lat['p50_ms']:.1f} ms, p95 {lat['p95_ms']:.1f} ms, max {lat['max_ms']:.1f} ms over {lat['n']} "
        f"queries; {_throughput(results)}</p>",
        _img(latency_png, "latency histogram"),
        "<h2>Videos</h2>",
        _videos(records),
        "<h2>Config</h2>",
        f"<pre>{html.escape(json.dumps(results['config'], indent=2))}</pre>",
    ]
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>cosmos-robot eval</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
    (out_dir / REPORT_HTML).write_text(page, encoding="utf-8")
