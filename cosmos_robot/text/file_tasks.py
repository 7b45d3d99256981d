"""Prompt files as text tasks (``jsonl:PATH``): GSM8K's own JSONL, or any prompt + answer lines.

The generated tasks cover what runs offline; real post-training reads a dataset the user has, e.g.
GSM8K's ``train.jsonl`` / ``test.jsonl``. ``data.task = "jsonl:data/gsm8k/train.jsonl"`` (and
``eval.task = "jsonl:data/gsm8k/test.jsonl"``) makes such a file a task for every text trainer and
for ``eval --suite text/jsonl:PATH``. Lines are objects:

- GSM8K's format ``{"question": "...", "answer": "<worked solution>\\n#### 72"}``: the ground truth is the
  text after the last ``####`` (commas removed), the SFT solution is the whole answer, the prompt
  gets verl's instruction (``Let's think step by step and output the final answer after "####".``)
  and the reward is verl's ``gsm8k`` rule;
- otherwise ``{"prompt": "text", "answer": "...", "solution"?: "...", "system"?: "...", ...}``: scored
  with ``exact_match`` unless the recipe names a reward (``reward.name``); extra keys are passed to
  the scorer as task fields (Countdown's ``numbers`` / ``target``, for instance).

A file has no held-out part of its own: both splits are the whole file (give a separate test file
to ``eval``). Example ``seed`` is line ``seed`` modulo the line count.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from cosmos_robot.text.chat import read_jsonl
from cosmos_robot.text.tasks import TextTask

__all__ = ["GSM8K_INSTRUCTION", "JSONL_PREFIX", "file_task"]

JSONL_PREFIX = "jsonl:"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_RESERVED = {"question", "prompt", "answer", "solution", "system"}
Row = tuple[str, str, str, dict[str, Any], str, str | None]  # problem, answer, solution, fields, reward, system


def _row(record: dict[str, Any], where: str) -> Row:
    system = record.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"{where}: 'system' must be a string")
    answer = record.get("answer")
    if isinstance(record.get("question"), str) and isinstance(answer, str) and "####" in answer:
        truth = answer.split("####")[-1].strip().replace(",", "")
        return f"{record['question']} {GSM8K_INSTRUCTION}", truth, answer, {}, "gsm8k", system
    prompt = record.get("prompt", record.get("question"))
    if not isinstance(prompt, str) or answer is None:
        raise ValueError(f"{where}: a task line needs a string 'prompt' (or 'question') and an 'answer'")
    fields = {k: v for k, v in record.items() if k not in _RESERVED}
    return prompt, str(answer), str(record.get("solution", answer)), fields, "exact_match", system


@functools.lru_cache(maxsize=16)
def _rows(path: str) -> tuple[Row, ...]:
    if not Path(path).is_file():
        raise ValueError(f"text task file {path!r} does not exist")
    what = "a task line: prompt or question, and answer"
    return tuple(_row(record, where) for where, record in read_jsonl(path, ("answer",), what))


def file_task(task_name: str) -> TextTask:
    """The text task ``jsonl:PATH``: line ``seed % lines`` is example ``seed``; both splits hold every line."""
    path = task_name[len(JSONL_PREFIX) :]
    rows = _rows(path)
    kinds = {(r[4], r[5]) for r in rows}
    if len(kinds) > 1:
        raise ValueError(
            f"text task file {path!r} mixes kinds of lines (GSM8K '####' answers with others, or different "
            "'system' prompts): one task per file"
        )
    reward, system = kinds.pop()

    def make_indexed(seed: int) -> tuple[str, str, str, dict[str, Any]]:
        problem, answer, solution, fields, _, _ = rows[seed % len(rows)]
        return problem, answer, solution, dict(fields)

    return TextTask(
        task_name,
        reward,
        system=system,
        description=f"{len(rows)} lines of {path}",
        make_indexed=make_indexed,
        split_by_hash=False,
    )
