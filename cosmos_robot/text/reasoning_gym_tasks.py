"""reasoning-gym's offline generators as text tasks (``rg/<dataset>``) with its own scorers.

reasoning-gym (pip ``reasoning-gym``, pure Python, no downloads) generates verifiable problems
(``gsm_symbolic``: GSM8K's templates with fresh numbers; ``countdown``; ``chain_sum``;
``basic_arithmetic``; ``products``; about a hundred more) and scores answers with a per-dataset
``score_answer``. Here any of them is a text task named ``rg/<dataset>``: the same recipes,
splits, rewards and ``eval --suite text/rg/<dataset>`` as the built-in tasks.

How a task maps onto ours:

- a problem is entry ``seed`` of the dataset built with seed 0 and a pool of ``POOL`` entries
  (reasoning-gym precomputes per-entry choices, so an unbounded pool is not an option); the split
  (one problem in ten held out) is decided by a hash of the question, like every text task;
- the prompt is reasoning-gym's default system prompt (answer inside ``<answer></answer>``) plus the
  question; the SFT solution is ``<answer>ANSWER</answer>``, preceded by the worked solution where
  the dataset has one (``gsm_symbolic``'s ``answer_cot``);
- the ``reasoning_gym`` reward extracts the last ``<answer>`` block (reasoning-gym's
  ``extract_answer``) and returns the dataset's ``score_answer`` for the regenerated entry (the
  ground truth carries only the dataset name and index, so it stays JSON for reward services).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from cosmos_robot.text.tasks import TextTask

__all__ = ["POOL", "RG_PREFIX", "reasoning_gym_reward", "rg_dataset", "rg_task"]

RG_PREFIX = "rg/"
POOL = 100_000  # entries per dataset (problems drawn by index modulo the pool)
REWARD = "reasoning_gym"


def _module() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:  # an optional dependency: say how to get it
        raise ValueError(
            "text tasks rg/<dataset> need the reasoning-gym package (pip install 'reasoning-gym==0.1.25'; "
            "`make setup` installs it)"
        ) from exc
    return reasoning_gym


@functools.lru_cache(maxsize=32)
def rg_dataset(name: str) -> Any:
    """The reasoning-gym dataset ``name`` (seed 0, ``POOL`` entries); a clear error for unknown names."""
    rg = _module()
    try:
        return rg.create_dataset(name, seed=0, size=POOL)
    except (KeyError, ValueError) as exc:
        import difflib

        from reasoning_gym.factory import DATASETS

        hint = difflib.get_close_matches(name, list(DATASETS), n=1)
        extra = f"; did you mean {RG_PREFIX}{hint[0]}?" if hint else ""
        raise ValueError(f"reasoning-gym has no dataset {name!r}{extra}") from exc


def _entry(name: str, index: int) -> dict[str, Any]:
    return dict(rg_dataset(name)[int(index) % POOL])


def rg_task(task_name: str) -> TextTask:
    """The text task ``rg/<dataset>``."""
    if not task_name.startswith(RG_PREFIX):
        raise ValueError(f"a reasoning-gym task is named {RG_PREFIX}<dataset>, got {task_name!r}")
    name = task_name[len(RG_PREFIX) :]
    rg_dataset(name)  # fail now, naming the dataset, rather than at the first example
    system = _module().utils.SYSTEM_PROMPTS["default"]

    def make(rng: np.random.Generator) -> tuple[str, str, str, dict[str, Any]]:
        index = int(rng.integers(0, POOL))
        entry = _entry(name, index)
        answer = str(entry["answer"])
        cot = (entry.get("metadata") or {}).get("answer_cot")
        solution = f"<answer>{answer}</answer>" if not cot else f"{cot}\n<answer>{answer}</answer>"
        return str(entry["question"]), answer, solution, {"rg_dataset": name, "rg_index": index}

    return TextTask(task_name, REWARD, make, system=system, description=f"reasoning-gym {name}")


def reasoning_gym_reward(completion: str, example: dict[str, Any]) -> float:
    """reasoning-gym's score of the completion's last ``<answer>`` block for the example's entry."""
    if "rg_dataset" not in example or "rg_index" not in example:
        raise ValueError("the reasoning_gym reward scores rg/<dataset> tasks: the example has no rg_dataset / rg_index")
    name = str(example["rg_dataset"])
    extracted = _module().utils.extract_answer(completion)
    return float(rg_dataset(name).score_answer(extracted, _entry(name, int(example["rg_index"]))))
