"""Trivial policies for smoke tests, benchmarks and client bring-up, servable with
``cosmos-robot serve --policy cosmos_robot_server.example_policies:constant``.

They do no learning: they return a fixed action chunk (optionally after a fixed delay that
stands in for model cost), so a robot integrator can check wiring, shapes and latency before a
real checkpoint exists, and the serving benchmark measures transport overhead, not a model.

``StepCounterPolicy`` (``:step_counter``) is the reference for a policy with per-episode state:
it declares ``new_session()`` so the server keeps one state per client session, and one client's
reset does not reset anybody else's episode (see ``cosmos_robot_server.core``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy, BatchPolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec, TextSpec

__all__ = [
    "ConstantBatchPolicy",
    "ConstantPolicy",
    "StepCounterPolicy",
    "constant",
    "constant_unbatched",
    "libero_input_spec",
    "step_counter",
]


def libero_input_spec(image_size: int = 224, state_dim: int = 8, state_optional: bool = False) -> InputSpec:
    """openpi's LIBERO request: two HWC uint8 cameras, 8-D state, prompt.

    ``state_optional=True`` also admits cosmos-framework's LIBERO client, which sends no state.
    """
    return InputSpec(
        {
            "observation/image": ArraySpec((image_size, image_size, 3), "uint8"),
            "observation/wrist_image": ArraySpec((image_size, image_size, 3), "uint8"),
            "observation/state": ArraySpec((state_dim,), "floating", optional=state_optional),
            "prompt": TextSpec(),
        }
    )


class ConstantPolicy(BasePolicy):
    """Answers every request with a constant (H, D) chunk after ``delay_ms``; one call per request.

    ``action_horizon`` is H, the chunk's rows (our ``chunk_size``): named after the metadata key it
    announces, which external clients read, and kept for ``-a action_horizon=`` command lines."""

    def __init__(
        self,
        action_horizon: int = 10,
        action_dim: int = 7,
        value: float = 0.0,
        delay_ms: float = 0.0,
        spec: InputSpec | None = None,
    ) -> None:
        if action_horizon < 1 or action_dim < 1:
            raise ValueError(f"action_horizon and action_dim must be >= 1, got {action_horizon}, {action_dim}")
        self.action_horizon = action_horizon
        self.action_dim = action_dim
        self.value = float(value)
        self.delay_s = delay_ms / 1000.0
        self._spec = spec
        self.calls = 0
        self.resets = 0

    @property
    def metadata(self) -> dict[str, Any]:
        return {"action_horizon": self.action_horizon, "action_dim": self.action_dim, "policy": type(self).__name__}

    @property
    def input_spec(self) -> InputSpec | None:
        return self._spec

    @property
    def cheap_inference(self) -> bool:
        return self.delay_s == 0  # a numpy fill: safe to run on the server's event loop

    def _chunk(self) -> np.ndarray:
        return np.full((self.action_horizon, self.action_dim), self.value, dtype=np.float32)

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return {"actions": self._chunk()}

    def reset(self) -> None:
        self.resets += 1


class ConstantBatchPolicy(ConstantPolicy, BatchPolicy):
    """Same answer, but a whole batch costs one ``delay_ms`` (like one GPU forward pass)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_sizes: list[int] = []

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        self.batch_sizes.append(len(obs_batch))
        if self.delay_s:
            time.sleep(self.delay_s)
        return [{"actions": self._chunk()} for _ in obs_batch]

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return self.infer_batch([obs])[0]


class StepCounterPolicy(BatchPolicy):
    """Counts steps since its session's reset: ``actions`` are all that count, ``steps`` says it too.

    Session-aware: ``new_session()`` makes one episode's state, and the server passes each request's
    state in as ``sessions=`` / ``session=``. Called directly (no server), it keeps one local session
    that ``reset()`` renews, like any ``BasePolicy``."""

    def __init__(self, action_horizon: int = 10, action_dim: int = 7) -> None:
        self.action_horizon = action_horizon
        self.action_dim = action_dim
        self._local = self.new_session()

    @property
    def metadata(self) -> dict[str, Any]:
        return {"action_horizon": self.action_horizon, "action_dim": self.action_dim, "policy": type(self).__name__}

    @property
    def cheap_inference(self) -> bool:
        return True

    def new_session(self) -> dict[str, int]:
        return {"steps": 0}

    def infer_batch(
        self, obs_batch: Sequence[dict[str, Any]], *, sessions: Sequence[dict[str, int]] | None = None
    ) -> list[dict[str, Any]]:
        states = list(sessions) if sessions is not None else [self._local] * len(obs_batch)
        out = []
        for state in states:
            state["steps"] += 1
            actions = np.full((self.action_horizon, self.action_dim), state["steps"], dtype=np.float32)
            out.append({"actions": actions, "steps": state["steps"]})
        return out

    def infer(self, obs: dict[str, Any], *, session: dict[str, int] | None = None) -> dict[str, Any]:
        return self.infer_batch([obs], sessions=None if session is None else [session])[0]

    def reset(self) -> None:
        self._local = self.new_session()


def step_counter(action_horizon: int = 10, action_dim: int = 7) -> StepCounterPolicy:
    """Factory for ``--policy``: the session-aware step counter."""
    return StepCounterPolicy(action_horizon, action_dim)


def constant(
    action_horizon: int = 10, action_dim: int = 7, delay_ms: float = 0.0, libero_spec: bool = False
) -> ConstantBatchPolicy:
    """Factory for ``--policy``: a batch-capable constant policy."""
    return ConstantBatchPolicy(
        action_horizon, action_dim, delay_ms=delay_ms, spec=libero_input_spec() if libero_spec else None
    )


def constant_unbatched(
    action_horizon: int = 10, action_dim: int = 7, delay_ms: float = 0.0, libero_spec: bool = False
) -> ConstantPolicy:
    """Factory for ``--policy``: a constant policy without batch support (called per request)."""
    return ConstantPolicy(
        action_horizon, action_dim, delay_ms=delay_ms, spec=libero_input_spec() if libero_spec else None
    )
