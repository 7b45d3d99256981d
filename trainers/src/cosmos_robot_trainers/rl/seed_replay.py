"""Seed replay: spend part of each iteration's groups on seeds whose outcome was in doubt last time.

Why: a group-relative advantage teaches only where a group's episodes differ. In driving GRPO a
collision is nearly fixed by the seed: in runs of 8 groups of 8, only 0-2 groups per iteration had both
crashes and safe episodes (``groups_mixed_success``), and iterations without such a group had gradient
norms of 0.01-0.05 against 0.5-1.3 with one (docs/driving.md). Fresh seeds alone keep drawing groups
whose outcome is already settled. Prioritized Level Replay (Jiang et al., 2021) replays the levels with
the most learning potential; here the potential of a seed is the spread of its group's successes,
``p (1 - p)`` for a group success rate ``p`` (0 when every episode succeeded or every one failed), the
variance-based score that LLM RL curricula use for prompts.

``rollout.seed_replay`` is the share of each iteration's groups drawn from a pool of (task, seed)
pairs; the rest are fresh seeds as before. After each iteration every group's score is recorded: a
seed with a positive score enters (or stays in) the pool, one whose group turned out settled leaves it.
A replayed seed is picked by score, then by how long ago it was last run (so equal scores take turns),
then by seed; a seed runs at most once per iteration. The pool is capped at ``rollout.seed_replay_pool``
(the lowest score, then the stalest, goes). Its state is saved with each checkpoint, so a resumed run
replays the same seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class _Spec(Protocol):
    @property
    def task(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def group(self) -> int: ...


@dataclass
class SeedEntry:
    """A pooled seed: its task, the score of its last group and the iteration that group ran in."""

    task: str
    seed: int
    score: float
    last_iter: int


def group_scores(ep_group: torch.Tensor, ep_success: torch.Tensor, ep_failed: torch.Tensor) -> dict[int, float]:
    """``{group: p (1 - p)}`` over each group's episodes whose worker did not crash (p: success rate);
    a group with none left has no score."""
    out: dict[int, float] = {}
    for g in torch.unique(ep_group).tolist():
        mask = (ep_group == g) & ~ep_failed
        if bool(mask.any()):
            p = float(ep_success[mask].float().mean())
            out[int(g)] = p * (1.0 - p)
    return out


class SeedReplay:
    """The pool of seeds in doubt (module docstring): ``pick`` before an iteration, ``update`` after it."""

    def __init__(self, fraction: float, capacity: int) -> None:
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"rollout.seed_replay: expected a share of the groups in [0, 1), got {fraction}")
        if capacity < 1:
            raise ValueError(f"rollout.seed_replay_pool: expected >= 1 seeds, got {capacity}")
        self.fraction = fraction
        self.capacity = capacity
        self.pool: dict[tuple[str, int], SeedEntry] = {}

    def pick(self, n_groups: int) -> list[tuple[str, int]]:
        """The (task, seed) pairs to replay this iteration: ``floor(fraction * n_groups)`` at most, highest
        score first, then the longest unseen."""
        n = min(int(self.fraction * n_groups), len(self.pool))
        ranked = sorted(self.pool.values(), key=lambda e: (-e.score, e.last_iter, e.task, e.seed))
        return [(e.task, e.seed) for e in ranked[:n]]

    def update(
        self, specs: Sequence[_Spec], rollout: Any, iteration: int, replayed: Sequence[tuple[str, int]]
    ) -> dict[str, float]:
        """Record every group's score (``rollout``'s episodes are ``specs``' in order); the metrics."""
        scores = group_scores(rollout.ep_group, rollout.ep_success, rollout.ep_failed)
        first: dict[int, _Spec] = {}
        for spec in specs:
            first.setdefault(spec.group, spec)
        replayed_set = set(replayed)
        replay_mixed = 0
        for group, score in scores.items():
            spec = first[group]
            key = (spec.task, spec.seed)
            if key in replayed_set and score > 0:
                replay_mixed += 1
            if score > 0:
                self.pool[key] = SeedEntry(spec.task, spec.seed, score, iteration)
            else:
                self.pool.pop(key, None)
        if len(self.pool) > self.capacity:
            ranked = sorted(self.pool.values(), key=lambda e: (-e.score, -e.last_iter, e.task, e.seed))
            self.pool = {(e.task, e.seed): e for e in ranked[: self.capacity]}
        return {
            "seed_replay_groups": float(len(replayed)),
            "seed_replay_mixed": float(replay_mixed),
            "seed_replay_pool": float(len(self.pool)),
        }

    def state_dict(self) -> list[list[Any]]:
        return [[e.task, e.seed, e.score, e.last_iter] for e in self.pool.values()]

    def load_state_dict(self, state: Sequence[Sequence[Any]]) -> None:
        self.pool = {}
        for task, seed, score, last_iter in state:
            self.pool[(str(task), int(seed))] = SeedEntry(str(task), int(seed), float(score), int(last_iter))
