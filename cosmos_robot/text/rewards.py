"""Reward providers for text completions: rule-based scorers by name, and an HTTP reward service.

A reward is ``score(completion, example) -> float`` where ``example`` carries the task's ground
truth (``answer``, and task-specific fields such as Countdown's ``numbers`` / ``target``). The
rule-based scorers follow the anchors' published rules (shared/research/text_posttrain_anchors.md §4):

- ``exact_match``: the completion, stripped, equals the answer (1 / 0);
- ``digit_match``: partial credit per digit in place (right-aligned), 1 only when exact;
- ``gsm8k``: verl's rule: the last ``#### number`` in the last 300 characters (strict), or the last
  number there (flexible), compared as a string with ``,`` and ``$`` removed (1 / 0);
- ``countdown``: TinyZero's rule: the last ``<answer>...</answer>``, every given number used once,
  only ``+ - * / ( )``; right 1.0, wrong or invalid 0.1, no answer 0;
- ``reasoning_gym``: reasoning-gym's own ``score_answer`` of the last ``<answer>`` block, for the
  ``rg/<dataset>`` tasks.

``HttpReward`` posts ``{"completions": [...], "examples": [...]}`` as JSON and expects
``{"rewards": [float, ...]}`` of the same length back; timeouts, HTTP errors and malformed replies
raise ``RewardError`` naming the URL and what was wrong (a trainer never trains on a made-up reward).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from cosmos_robot.text.reasoning_gym_tasks import reasoning_gym_reward

__all__ = ["REWARDS", "HttpReward", "RewardError", "get_reward", "safe_arithmetic"]

Example = dict[str, Any]
RewardFn = Callable[[str, Example], float]


class RewardError(RuntimeError):
    """A reward that cannot be computed; the message names the scorer and the cause."""


def exact_match(completion: str, example: Example) -> float:
    return float(completion.strip() == str(example["answer"]).strip())


def digit_match(completion: str, example: Example) -> float:
    """Partial credit for a number: the share of the answer's characters right at their place (aligned at the
    right, where the units are), 1 only for the exact answer. A dense signal for tiny models' arithmetic."""
    got, want = completion.strip(), str(example["answer"]).strip()
    if got == want:
        return 1.0
    width = max(len(got), len(want), 1)
    hits = sum(a == b for a, b in zip(got.rjust(width), want.rjust(width)))
    return min(hits / width, 0.99)


_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def gsm8k(completion: str, example: Example, flexible: bool = False) -> float:
    tail = completion[-300:]
    if flexible:
        found = [x for x in _NUMBER.findall(tail) if x not in ("", ".")]
        answer = found[-1] if found else None
    else:
        found = _STRICT.findall(tail)
        answer = found[-1] if found else None
    if answer is None:
        return 0.0
    clean = answer.replace(",", "").replace("$", "")
    return float(clean == str(example["answer"]).replace(",", "").strip())


_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def safe_arithmetic(expression: str) -> float:
    """Evaluate ``+ - * /`` over numbers and parentheses only (an AST walk, never ``eval``)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    return walk(ast.parse(expression, mode="eval"))


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def countdown(completion: str, example: Example) -> float:
    found = _ANSWER.findall(completion)
    if not found:
        return 0.0
    equation = found[-1].strip()
    used = sorted(int(x) for x in re.findall(r"\d+", equation))
    if used != sorted(int(x) for x in example["numbers"]) or not re.fullmatch(r"[\d+\-*/().\s]+", equation):
        return 0.1
    try:
        value = safe_arithmetic(equation)
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
        return 0.1
    return 1.0 if math.isfinite(value) and abs(value - float(example["target"])) < 1e-5 else 0.1


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "digit_match": digit_match,
    "gsm8k": gsm8k,
    "gsm8k_flexible": lambda c, e: gsm8k(c, e, flexible=True),
    "countdown": countdown,
    "reasoning_gym": reasoning_gym_reward,
}


def get_reward(name: str) -> RewardFn:
    """A registered scorer, or an ``HttpReward`` for ``http://`` / ``https://`` URLs."""
    if name.startswith(("http://", "https://")):
        return HttpReward(name)
    if name not in REWARDS:
        raise RewardError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))} or an http(s):// service URL")
    return REWARDS[name]


class HttpReward:
    """A reward service over HTTP JSON (one POST per batch); see the module docstring for the contract."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url, self.timeout_s = url, timeout_s

    def __call__(self, completion: str, example: Example) -> float:
        return self.batch([completion], [example])[0]

    def batch(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        body = json.dumps({"completions": list(completions), "examples": list(examples)}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
            raise RewardError(f"reward service {self.url}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RewardError(f"reward service {self.url}: no answer within {self.timeout_s} s ({reason})") from exc
        try:
            rewards = json.loads(raw)["rewards"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RewardError(f"reward service {self.url}: reply is not JSON with a 'rewards' list") from exc
        if not isinstance(rewards, list) or len(rewards) != len(completions):
            raise RewardError(
                f"reward service {self.url}: expected {len(completions)} rewards, got "
                f"{len(rewards) if isinstance(rewards, list) else type(rewards).__name__}"
            )
        bad = [i for i, r in enumerate(rewards) if not isinstance(r, (int, float)) or not math.isfinite(r)]
        if bad:
            raise RewardError(f"reward service {self.url}: rewards {bad[:5]} are not finite numbers")
        return [float(r) for r in rewards]
