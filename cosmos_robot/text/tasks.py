"""Text tasks: seeded prompt generators with ground truth, a default reward, and held-out splits.

A text task plays the part a simulator plays for robot policies: ``example(seed)`` is a reset
(deterministic in its seed), the reward provider scores the completion, and the same ``eval``
command reports success rates with Wilson intervals (``--suite text/<task>``). Each example is in
exactly one split, decided by a hash of its problem (not of its seed), so the 500 held-out prompts
of an evaluation are never trained on whatever seeds training draws.

Tasks (all offline, generated here):

- ``addition``: ``47+85=`` -> ``132`` (two 2-digit numbers; ``addition3`` uses 3 digits);
- ``chain_sum``: ``12+7-30+4=`` -> ``-7`` (3-4 terms of 1-2 digits, like reasoning-gym's chain_sum);
- ``countdown``: reach a target with 3-4 numbers and ``+ - * /`` (TinyZero's prompt and reward);
- ``rg/<dataset>``: any of reasoning-gym's offline generators (``rg/gsm_symbolic``, ``rg/countdown``,
  ...) with its own scorer (``reasoning_gym_tasks.py``);
- ``jsonl:PATH``: a prompt file the user has, e.g. GSM8K's JSONL (``file_tasks.py``);
- ``shapes/<question>``: questions about a rendered image (``shapes/count``, ``shapes/left_right``,
  ``shapes/mixed``) for image-text models (``visual_tasks.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["IMAGE_PLACEHOLDER", "TASKS", "TASK_PROVIDERS", "TextExample", "TextTask", "get_task", "task_examples"]

IMAGE_PLACEHOLDER = "<image>"  # where an image goes in a prompt's text (expanded by cosmos_robot.text.vision)
SPLITS = ("train", "eval")
EVAL_SHARE = 10  # one problem in EVAL_SHARE is held out


@dataclass(frozen=True)
class TextExample:
    """One prompt with its ground truth; ``solution`` is the assistant text SFT trains on."""

    task: str
    seed: int
    prompt: list[dict[str, str]]
    answer: str
    solution: str
    fields: dict[str, Any] = field(default_factory=dict)
    # the prompt's images (H, W, 3) uint8, one per ``<image>`` placeholder (cosmos_robot.text.vision); visual
    # tasks draw them from ``fields`` (a scene), so the ground truth stays JSON-serialisable
    images: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def ground_truth(self) -> dict[str, Any]:
        """What a reward scorer reads (``answer`` plus task fields); JSON-serialisable."""
        return {"task": self.task, "answer": self.answer, **self.fields}

    @property
    def problem(self) -> str:
        return self.prompt[-1]["content"]

    @property
    def key(self) -> str:
        """What identifies the problem: its text, plus the fields its images are drawn from (a visual task asks
        the same question of many scenes)."""
        if not self.images:
            return self.problem
        import json

        return f"{self.problem}\n{json.dumps(self.fields, sort_keys=True)}"


Made = tuple[str, str, str, dict[str, Any]]  # (problem text, answer, solution, fields)


@dataclass(frozen=True)
class TextTask:
    """A named generator: ``make(rng) -> (problem text, answer, solution, fields)``.

    ``make_indexed(seed)`` replaces ``make`` for tasks whose problems are a list (a file's lines);
    ``split_by_hash = False`` puts every problem in both splits (a file has no held-out part of its own).
    ``render(fields) -> images`` makes a visual task's images (``TextExample.images``) from its fields.
    """

    name: str
    reward: str
    make: Callable[[np.random.Generator], Made] | None = None
    system: str | None = None
    description: str = ""
    make_indexed: Callable[[int], Made] | None = None
    split_by_hash: bool = True
    render: Callable[[dict[str, Any]], list[Any]] | None = None

    def example(self, seed: int) -> TextExample:
        if self.make_indexed is not None:
            problem, answer, solution, fields = self.make_indexed(seed)
        elif self.make is not None:
            problem, answer, solution, fields = self.make(np.random.default_rng([seed, 7919]))
        else:
            raise ValueError(f"text task {self.name} has neither make nor make_indexed")
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": problem}
        ]
        images = tuple(self.render(fields)) if self.render is not None else ()
        return TextExample(self.name, seed, messages, answer, solution, fields, images)

    def split_of(self, example: TextExample) -> str:
        digest = hashlib.sha256(f"{self.name}:{example.key}".encode()).digest()
        return "eval" if digest[0] % EVAL_SHARE == 0 else "train"

    def in_split(self, example: TextExample, split: str) -> bool:
        return not self.split_by_hash or self.split_of(example) == split


def _addition(digits: int) -> Callable[[np.random.Generator], tuple[str, str, str, dict[str, Any]]]:
    low, high = 10 ** (digits - 1), 10**digits

    def make(rng: np.random.Generator) -> tuple[str, str, str, dict[str, Any]]:
        a, b = (int(x) for x in rng.integers(low, high, size=2))
        return f"{a}+{b}=", str(a + b), str(a + b), {}

    return make


def _chain_sum(rng: np.random.Generator) -> tuple[str, str, str, dict[str, Any]]:
    terms = [int(x) for x in rng.integers(1, 100, size=int(rng.integers(3, 5)))]
    signs = ["+" if s else "-" for s in rng.integers(0, 2, size=len(terms) - 1)]
    text, total = str(terms[0]), terms[0]
    for s, t in zip(signs, terms[1:]):
        text += f"{s}{t}"
        total += t if s == "+" else -t
    return f"{text}=", str(total), str(total), {}


def _countdown(rng: np.random.Generator) -> tuple[str, str, str, dict[str, Any]]:
    while True:
        numbers = [int(x) for x in rng.integers(1, 50, size=int(rng.integers(3, 5)))]
        order = [numbers[i] for i in rng.permutation(len(numbers))]
        expr, value = str(order[0]), float(order[0])
        for n in order[1:]:
            op = "+-*"[int(rng.integers(0, 3))]
            expr = f"({expr}){op}{n}" if op == "*" else f"{expr}{op}{n}"
            value = value * n if op == "*" else value + n if op == "+" else value - n
        if 1 <= value <= 1000 and value == int(value):
            break
    target = int(value)
    problem = (
        f"Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. "
        "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )
    return problem, expr, f"<think>\n</think>\n<answer>{expr}</answer>", {"numbers": numbers, "target": target}


TASKS: dict[str, TextTask] = {
    t.name: t
    for t in (
        TextTask("addition", "exact_match", _addition(2), description="two 2-digit numbers"),
        TextTask("addition3", "exact_match", _addition(3), description="two 3-digit numbers"),
        TextTask("chain_sum", "exact_match", _chain_sum, description="3-4 terms of 1-2 digits, + and -"),
        TextTask("countdown", "countdown", _countdown, description="TinyZero's Countdown, 3-4 numbers"),
    )
}


# task families resolved by name prefix: "module:function" (the function takes the whole name), imported
# on first use so their optional dependencies load only when asked for
TASK_PROVIDERS: dict[str, str] = {
    "rg/": "cosmos_robot.text.reasoning_gym_tasks:rg_task",
    "jsonl:": "cosmos_robot.text.file_tasks:file_task",
    "shapes/": "cosmos_robot.text.visual_tasks:shapes_task",
}


def get_task(name: str) -> TextTask:
    for prefix, target in TASK_PROVIDERS.items():
        if name.startswith(prefix):
            import importlib

            module, _, function = target.partition(":")
            task: TextTask = getattr(importlib.import_module(module), function)(name)
            return task
    if name not in TASKS:
        import difflib

        hint = difflib.get_close_matches(name, list(TASKS), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        families = ", ".join(f"{p}<name>" for p in TASK_PROVIDERS)
        raise ValueError(f"unknown text task {name!r} (known: {', '.join(TASKS)}; {families}){extra}")
    return TASKS[name]


def task_examples(task: str | TextTask, split: str, n: int, seed: int = 0) -> list[TextExample]:
    """``n`` examples of ``split`` in seed order starting at ``seed * 1_000_003`` (disjoint per ``seed``).

    Duplicated problems are skipped within one call, so ``n`` held-out prompts are ``n`` distinct problems.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    t = get_task(task) if isinstance(task, str) else task
    out: list[TextExample] = []
    seen: set[str] = set()
    s = seed * 1_000_003
    tries = 0
    while len(out) < n:
        ex = t.example(s)
        s += 1
        tries += 1
        if tries > 200 * n + 10_000:
            raise ValueError(f"text task {t.name}: could not draw {n} distinct {split} problems ({len(out)} found)")
        if not t.in_split(ex, split) or ex.key in seen:
            continue
        seen.add(ex.key)
        out.append(ex)
    return out
