"""Ray backend: each env lives in a Ray actor, so envs can run on other machines of a Ray cluster.

Why actors and not Ray's own vector-env helpers: the semantics (partial reset with per-env options,
a dead or hung actor truncates one episode and is replaced) must match the local backends exactly, so
the actor is a thin shell around the same :class:`EnvRunner` and speaks the same msgpack messages as
a subprocess worker, arrays inline. Ray ships the env factory to the actor with its own serializer
(the cluster is the trust boundary, as for any Ray program); the per-step payloads are msgpack bytes.

A dead actor (``RayActorError``) or one with no reply within the timeout is killed with
``ray.kill`` and replaced; the replacement builds its env on its first command. Actor calls from one
caller run in order, so no separate "ready" handshake is needed. Install with
``pip install cosmos-robot-envs[ray]``; connect to a cluster with ``ray.init(address=...)`` first
(otherwise Ray starts a local instance).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from cosmos_robot_envs.vector.base import BatchedEnv, Command, ResetCmd, env_fn_list
from cosmos_robot_envs.vector.runner import (
    ENV_ERROR,
    WORKER_CRASHED,
    WORKER_TIMEOUT,
    EnvFn,
    EnvReply,
    EnvRunner,
    Failure,
    Outcome,
    describe_exception,
)
from cosmos_robot_envs.vector.spaces import space_from_data
from cosmos_robot_envs.vector.wire import WireError, pack, unpack

__all__ = ["RayBatchedEnv"]


class EnvActor:
    """The body of one Ray actor: builds its env lazily and answers msgpack commands with msgpack."""

    def __init__(self, env_fn: EnvFn, index: int) -> None:
        self._env_fn, self._index = env_fn, index
        self._runner: EnvRunner | None = None

    def _pack(self, msg: dict[str, Any]) -> bytes:
        try:
            return pack(msg)
        except WireError as exc:
            return pack(
                {"type": "error", "reason": ENV_ERROR, "message": f"env {self._index}: reply cannot be encoded ({exc})"}
            )

    def handle(self, payload: bytes) -> bytes:
        try:
            if self._runner is None:
                self._runner = EnvRunner(self._env_fn, self._index)
            msg = unpack(payload)
            if msg["cmd"] == "spaces":
                return self._pack({"type": "ready", **self._runner.spaces_message()})
            if msg["cmd"] == "reset":
                reply = self._runner.reset(msg["seed"], msg["options"])
            else:
                reply = self._runner.step(msg["action"])
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which replaces this actor
            return self._pack({"type": "error", "reason": ENV_ERROR, "message": describe_exception(exc)})
        return self._pack({"type": "reply", **reply.to_wire()})

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()


class RayBatchedEnv(BatchedEnv):
    """One Ray actor per env; see :class:`BatchedEnv` for the API."""

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        step_timeout: float | None = 60.0,
        reset_timeout: float | None = 120.0,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ImportError("mode='ray' needs Ray: pip install 'cosmos-robot-envs[ray]'") from exc
        self._ray = ray
        self._env_fns = env_fn_list(env_fns)
        self._actor_cls: Any = ray.remote(**{"num_cpus": 1, **(actor_options or {})})(EnvActor)
        self._actors: list[Any] = [self._actor_cls.remote(fn, i) for i, fn in enumerate(self._env_fns)]
        try:
            outcomes = self._call(dict.fromkeys(range(len(self._actors)), pack({"cmd": "spaces"})), reset_timeout)
            failed = {i: o for i, o in outcomes.items() if not isinstance(o, dict)}
            if failed:
                raise RuntimeError(
                    "env actors failed to start: "
                    + "; ".join(
                        f"env {i}: {o.reason}: {o.message}" for i, o in failed.items() if isinstance(o, Failure)
                    )
                )
            described = [pack(outcomes[i]) for i in range(len(self._actors))]
            if any(d != described[0] for d in described):
                raise ValueError("env actors report different spaces; all envs must match")
            first = outcomes[0]
            assert isinstance(first, dict)
            super().__init__(
                len(self._env_fns),
                space_from_data(first["observation_space"]),
                space_from_data(first["action_space"]),
                step_timeout=step_timeout,
                reset_timeout=reset_timeout,
            )
        except BaseException:
            self._kill_all()
            raise

    @property
    def actors(self) -> list[Any]:
        """The current actor handles (replaced after a failure)."""
        return list(self._actors)

    def _call(self, payloads: dict[int, bytes], timeout: float | None) -> dict[int, dict[str, Any] | Failure]:
        """Send each payload, await all; messages that are not replies come back as dicts."""
        ray = self._ray
        refs = {self._actors[i].handle.remote(p): i for i, p in payloads.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        done_set = set(done)
        results: dict[int, dict[str, Any] | Failure] = {}
        for ref, i in refs.items():
            if ref not in done_set:
                message = f"env {i}: actor gave no reply within {timeout} s"
                results[i] = Failure(WORKER_TIMEOUT, message)
                continue
            try:
                msg = unpack(ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                results[i] = Failure(WORKER_CRASHED, f"env {i}: actor died ({type(exc).__name__})")
                continue
            results[i] = Failure(msg["reason"], msg["message"]) if msg.get("type") == "error" else msg
        return results

    def _run(self, commands: dict[int, Command], timeout: float | None) -> dict[int, Outcome]:
        payloads: dict[int, bytes] = {}
        for i, cmd in commands.items():
            msg = (
                {"cmd": "reset", "seed": cmd.seed, "options": cmd.options}
                if isinstance(cmd, ResetCmd)
                else {"cmd": "step", "action": np.asarray(cmd.action)}
            )
            try:
                payloads[i] = pack(msg)
            except WireError as exc:
                raise TypeError(f"command for env {i} cannot be sent to its actor: {exc}") from exc
        outcomes: dict[int, Outcome] = {}
        for i, result in self._call(payloads, timeout).items():
            if isinstance(result, Failure):
                outcomes[i] = result
                self._restart(i)
            else:
                outcomes[i] = EnvReply.from_wire(result)
        return outcomes

    def _restart(self, i: int) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(self._actors[i], no_restart=True)
        self._actors[i] = self._actor_cls.remote(self._env_fns[i], i)

    def _kill_all(self) -> None:
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)

    def _close(self) -> None:
        ray = self._ray
        refs = []
        for actor in self._actors:
            with contextlib.suppress(Exception):
                refs.append(actor.close.remote())
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=10.0)
        self._kill_all()
