"""``ActionChunkBroker``: turn a chunk-predicting policy into a per-step policy.

A VLA predicts ``chunk_size`` future actions per call; a robot loop wants one action per control
tick. The broker calls the wrapped policy only when its cached chunk is used up (after
``action_horizon`` steps: openpi's name, kept for its callers, for what we call ``replan_steps``)
and hands out ``x[step]`` of every array leaf in between, so a 50 Hz loop replanning every 10 steps
makes 5 requests per second. Unlike openpi's broker it checks that the
chunk is long enough (a server with a shorter chunk is a clear error, not an IndexError) and
passes non-array leaves (timings, strings) through unchanged.

It also refuses a chunk holding NaN or infinity in any float array (``NonFiniteActionError``,
naming the key and the count) before handing out a single step: a checkpoint with NaN weights
answers with all-NaN chunks, and neither msgpack nor the websocket/ZMQ transports object. The
server checks its outputs too; this is the last check on the robot computer, so a broken or
hostile server can never make the robot receive a non-finite command.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy

__all__ = ["ActionChunkBroker", "NonFiniteActionError", "check_finite", "non_finite_leaves"]


class NonFiniteActionError(ValueError):
    """A policy reply holds NaN or infinite values: the robot must not receive it."""


def non_finite_leaves(tree: Any, prefix: str = "") -> list[tuple[str, int, int]]:
    """``(key path, non-finite count, size)`` of every float array leaf holding NaN or +-inf."""
    if isinstance(tree, dict):
        found: list[tuple[str, int, int]] = []
        for key, value in tree.items():
            found.extend(non_finite_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return found
    if isinstance(tree, np.ndarray) and (np.issubdtype(tree.dtype, np.floating) or np.iscomplexobj(tree)):
        bad = int(tree.size - np.count_nonzero(np.isfinite(tree)))
        if bad:
            return [(prefix or "<reply>", bad, int(tree.size))]
    return []


def check_finite(tree: Any, what: str = "policy reply") -> None:
    """Raise ``NonFiniteActionError`` naming each float array of ``tree`` with NaN/inf values and how many."""
    bad = non_finite_leaves(tree)
    if bad:
        parts = ", ".join(f"{key!r}: {n} of {size} values" for key, n, size in bad)
        raise NonFiniteActionError(
            f"{what} has non-finite (NaN or inf) values ({parts}); refused before reaching the robot "
            "(a checkpoint with NaN weights, or a broken server)"
        )


def _chunk_len(tree: Any) -> int | None:
    if isinstance(tree, np.ndarray):
        return int(tree.shape[0]) if tree.ndim else None
    if isinstance(tree, dict):
        lens = [n for n in (_chunk_len(v) for v in tree.values()) if n is not None]
        return min(lens) if lens else None
    return None


def _slice(tree: Any, step: int) -> Any:
    if isinstance(tree, np.ndarray) and tree.ndim:
        return tree[step]
    if isinstance(tree, dict):
        return {k: _slice(v, step) for k, v in tree.items()}
    return tree


class ActionChunkBroker(BasePolicy):
    """Wraps ``policy``; each ``infer`` returns one step of the current chunk."""

    def __init__(self, policy: BasePolicy, action_horizon: int) -> None:
        if action_horizon < 1:
            raise ValueError(f"action_horizon must be >= 1, got {action_horizon}")
        self.policy = policy
        self.action_horizon = action_horizon
        self._chunk: dict[str, Any] | None = None
        self._step = 0
        self.requests = 0

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self._chunk is None:
            chunk = self.policy.infer(obs)
            self.requests += 1
            length = _chunk_len(chunk.get("actions", chunk))
            if length is None:
                raise ValueError("policy reply has no array with a chunk axis (expected 'actions' of shape (H, D))")
            if length < self.action_horizon:
                raise ValueError(
                    f"policy returned a chunk of {length} steps but action_horizon is {self.action_horizon}; "
                    f"lower action_horizon to at most {length}"
                )
            check_finite(chunk, f"policy chunk (request {self.requests})")
            self._chunk = chunk
            self._step = 0
        out = _slice(self._chunk, self._step)
        self._step += 1
        if self._step >= self.action_horizon:
            self._chunk = None
        return out

    def reset(self) -> None:
        self.policy.reset()
        self._chunk = None
        self._step = 0

    @property
    def metadata(self) -> dict[str, Any]:
        return self.policy.metadata
