"""Asking the policy for action chunks: one request for every env that needs one, checked on arrival.

Why one request per control step: with N envs in lockstep, N sequential round trips cost N times
the network and framing overhead and hand a GPU server N batches of one. ``infer_batch`` sends one
``{"batch": [...]}`` websocket message (or one batched forward pass in-process), so the server's
batcher sees all N observations at once. ``batch_requests=False`` keeps the sequential path for the
benchmark that measures the difference.

Why check every reply: a policy trained for another robot answers ``(H, 8)`` or a 1-step action, and
executing that would fail deep inside the simulator (or silently run the wrong joints). The error
names the policy, the shape it returned and the shape the env needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy, supports_batch

__all__ = ["ChunkSource", "PolicyOutputError"]


class PolicyOutputError(ValueError):
    """The policy's reply cannot drive the env (missing ``actions``, wrong shape, non-finite values)."""


class ChunkSource:
    """``chunks, latencies_ms = source.query(wire_observations)``; counts requests and observations."""

    def __init__(
        self, policy: BasePolicy, *, name: str, action_dim: int, replan_steps: int, batch_requests: bool = True
    ) -> None:
        self.policy = policy
        self.name = name  # the URL or module:factory, for error messages
        self.action_dim = action_dim
        self.replan_steps = replan_steps
        self.batched = batch_requests and supports_batch(policy)
        self.requests = 0  # policy calls made (websocket messages when remote)
        self.observations = 0

    def query(self, obs_list: Sequence[dict[str, Any]]) -> tuple[list[np.ndarray], list[float]]:
        """One ``(H, action_dim)`` float chunk and one latency (ms) per observation, in order."""
        if self.batched:
            t0 = time.perf_counter()
            replies = self.policy.infer_batch(list(obs_list))  # type: ignore[attr-defined]
            latency = (time.perf_counter() - t0) * 1000
            self.requests += 1
            latencies = [latency] * len(obs_list)
            if not isinstance(replies, list) or len(replies) != len(obs_list):
                got = len(replies) if isinstance(replies, list) else type(replies).__name__
                raise PolicyOutputError(
                    f"{self.name}: infer_batch returned {got} results for {len(obs_list)} observations"
                )
        else:
            replies, latencies = [], []
            for obs in obs_list:
                t0 = time.perf_counter()
                replies.append(self.policy.infer(obs))
                latencies.append((time.perf_counter() - t0) * 1000)
                self.requests += 1
        self.observations += len(obs_list)
        return [self._check(reply) for reply in replies], latencies

    def _check(self, reply: Any) -> np.ndarray:
        want = f"(H, {self.action_dim}) with H >= replan_steps={self.replan_steps}"
        if not isinstance(reply, dict) or "actions" not in reply:
            keys = sorted(reply) if isinstance(reply, dict) else type(reply).__name__
            raise PolicyOutputError(f"{self.name}: reply has no 'actions' (got {keys}); expected actions {want}")
        try:
            actions = np.asarray(reply["actions"], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise PolicyOutputError(f"{self.name}: 'actions' is not numeric ({exc}); expected {want}") from exc
        if actions.ndim != 2 or actions.shape[1] != self.action_dim or actions.shape[0] < self.replan_steps:
            raise PolicyOutputError(
                f"{self.name}: policy returned actions of shape {actions.shape}; the env needs {want} "
                f"(env action dim {self.action_dim}; lower --replan-steps or serve a policy for this robot)"
            )
        if not np.all(np.isfinite(actions[: self.replan_steps])):
            raise PolicyOutputError(f"{self.name}: policy returned non-finite actions {actions[: self.replan_steps]}")
        return actions
