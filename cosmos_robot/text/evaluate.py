"""Text tasks as eval suites: ``cosmos-robot eval --ckpt DIR --suite text/<task>``.

Same results.json as the robot suites (``totals.success_rate``, per-task rates with Wilson 95%
intervals from ``cosmos_robot_envs.eval.stats.summarize``), because a prompt is an episode: its
seed names the problem, success is a reward of 1 (an exact answer), ``return`` is the reward.
Greedy decoding by default (temperature 0), so the numbers are reproducible; ``completions.jsonl``
holds every prompt, completion and reward, and report.html shows a sample of right and wrong ones.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any

from cosmos_robot.text.engines import SamplingParams, StaticGenerateEngine, TransformersEngine
from cosmos_robot.text.hf import CausalLM, load_causal_lm
from cosmos_robot.text.rewards import get_reward
from cosmos_robot.text.tasks import TextExample, get_task, task_examples
from cosmos_robot.text.vision import example_prompt

__all__ = ["TEXT_SUITE_PREFIX", "evaluate_lm", "run_text_eval", "text_task_of"]

TEXT_SUITE_PREFIX = "text/"


def text_task_of(suite: str) -> str:
    """``text/addition`` -> ``addition`` (checked against the task registry)."""
    name = suite[len(TEXT_SUITE_PREFIX) :] if suite.startswith(TEXT_SUITE_PREFIX) else suite
    return get_task(name).name


def evaluate_lm(
    lm: CausalLM,
    examples: list[TextExample],
    *,
    reward: str | None = None,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 256,
) -> list[dict[str, Any]]:
    """One row per example: prompt, completion, reward, success (reward >= 1)."""
    visual = any(ex.images for ex in examples)
    # image prompts: one padded generate (the continuous-batching engine samples text only)
    kind = StaticGenerateEngine if visual else TransformersEngine
    engine = kind(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    rows: list[dict[str, Any]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        task_reward = get_reward(reward or get_task(chunk[0].task).reward)
        inputs = [example_prompt(lm.tokenizer, lm.processor, ex) for ex in chunk]
        params = SamplingParams(max_new_tokens, temperature, 1.0, seed + start, log_probs=False)
        groups = engine.generate([p for p, _ in inputs], 1, params, images=[im for _, im in inputs] if visual else None)
        for ex, (completion,) in zip(chunk, groups):
            r = float(task_reward(completion.text, ex.ground_truth()))
            rows.append(
                {
                    "task": ex.task,
                    "seed": ex.seed,
                    "prompt": ex.problem,
                    "answer": ex.answer,
                    "completion": completion.text,
                    "stopped": completion.stopped,
                    "tokens": len(completion.ids),
                    "reward": r,
                    "success": r >= 1.0,
                }
            )
    return rows


def _report(out: Path, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    t = results["totals"]
    lines = [
        "<html><head><meta charset='utf-8'><title>text eval</title></head><body>",
        f"<h1>{html.escape(results['suite'])}: {html.escape(results['policy']['source'])}</h1>",
        f"<p>{t['successes']}/{t['episodes']} = {100 * t['success_rate']:.1f}% "
        f"[{100 * t['ci95_low']:.1f}%, {100 * t['ci95_high']:.1f}%] (Wilson 95%)</p>",
    ]
    for title, pick in (("right", True), ("wrong", False)):
        sample = [r for r in rows if r["success"] == pick][:20]
        lines.append(
            f"<h2>{title} ({sum(r['success'] == pick for r in rows)}; first {len(sample)})</h2><table border=1>"
        )
        lines.append("<tr><th>seed</th><th>prompt</th><th>answer</th><th>completion</th><th>reward</th></tr>")
        for r in sample:
            cells = (r["seed"], r["prompt"], r["answer"], r["completion"], r["reward"])
            lines.append("<tr>" + "".join(f"<td><pre>{html.escape(str(c))}</pre></td>" for c in cells) + "</tr>")
        lines.append("</table>")
    lines.append("</body></html>")
    (out / "report.html").write_text("\n".join(lines))


def run_text_eval(
    ckpt: str | Path,
    suite: str,
    out: str | Path,
    *,
    episodes_per_task: int = 500,
    seed: int = 0,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Evaluate an HF causal-LM folder on held-out prompts of a text task; writes and returns results.json."""
    from cosmos_robot_envs.eval.records import EpisodeRecord
    from cosmos_robot_envs.eval.stats import summarize

    task = text_task_of(suite)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    lm = load_causal_lm(ckpt, device=device)
    examples = task_examples(task, "eval", episodes_per_task, seed)
    setup_s = time.perf_counter() - started
    rows = evaluate_lm(lm, examples, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    loop_s = time.perf_counter() - started - setup_s
    records = [
        EpisodeRecord(
            task,
            i,
            r["seed"],
            bool(r["success"]),
            r["tokens"],
            r["reward"],
            truncated_reason=None if r["stopped"] else "max_new_tokens",
        )
        for i, r in enumerate(rows)
    ]
    with (out_dir / "completions.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    source = f"ckpt:{Path(ckpt).resolve()}"
    results: dict[str, Any] = {
        "suite": f"{TEXT_SUITE_PREFIX}{task}",
        "config": {
            "policy": source,
            "suite": f"{TEXT_SUITE_PREFIX}{task}",
            "tasks": [task],
            "split": "eval",
            "episodes_per_task": episodes_per_task,
            "seed": seed,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
        },
        "complete": len(rows) == episodes_per_task,
        "episodes_scheduled": episodes_per_task,
        **summarize(records, [task]),
        "episodes_missing": [],
        "infra_failures": [],
        "policy": {
            "source": source,
            "kind": "checkpoint",
            "checkpoint": source,
            "family": "hf_causal_lm",
            "metadata": {
                "model_type": lm.model.config.model_type,
                "parameters": sum(p.numel() for p in lm.model.parameters()),
            },
        },
        "episodes": [r.to_json() for r in records],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "throughput": {
            "episodes_this_run": len(rows),
            "episodes_resumed": 0,
            "setup_s": round(setup_s, 3),
            "loop_s": round(loop_s, 3),
            "episodes_per_min": round(60 * len(rows) / max(loop_s, 1e-9), 3),
            "completion_tokens": sum(r["tokens"] for r in rows),
        },
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _report(out_dir, results, rows)
    return results
