"""Subprocess backend: one worker process per env, shared memory for arrays, a watchdog per command.

Why not gymnasium's ``AsyncVectorEnv``: after a worker error it raises and the whole batch is
unusable, it has no per-command timeout (a hung sim hangs the run) and it pickles every message. Here
each command is sent to its worker and the replies are awaited together with
``multiprocessing.connection.wait`` on the pipes and the process sentinels, so the parent notices a
reply, a dead process or the deadline, whichever comes first. A failed worker is killed and a fresh
one is started from the same env factory right away; it builds its env while the others keep
stepping, and the next ``reset`` of that env waits for it. Its episode is reported as truncated.

Processes start with ``forkserver`` (the default on Linux: a clean, already-imported parent to fork
from, so restarts take milliseconds) or ``spawn``; never ``fork``, because an EGL context or a CUDA
runtime in the parent does not survive it. The env factory is pickled once by ``multiprocessing``
when the process starts (a local parent-to-own-child hand-off, the same as gymnasium); after that,
only msgpack crosses the pipe. With ``forkserver``, workers inherit the environment variables
(``MUJOCO_GL``, ...) of the fork server, which starts with the first pool of the program: set them
before that.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from cosmos_robot_envs.vector.base import BatchedEnv, Command, ResetCmd, env_fn_list
from cosmos_robot_envs.vector.env_factory import EnvFactory
from cosmos_robot_envs.vector.external import start_external_worker
from cosmos_robot_envs.vector.runner import ENV_ERROR, WORKER_CRASHED, WORKER_TIMEOUT, EnvFn, EnvReply, Failure, Outcome
from cosmos_robot_envs.vector.spaces import space_from_data
from cosmos_robot_envs.vector.wire import WireError, pack, unpack
from cosmos_robot_envs.vector.worker import SharedBlock, worker_main

__all__ = ["AsyncBatchedEnv", "default_start_method"]

START_TIMEOUT_S = 120.0  # the first start of the workers waits at least this long (imports, first env build)
_STEP = pack({"cmd": "step"})
_CLOSE = pack({"cmd": "close"})


def default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


@dataclass
class _Worker:
    process: Any  # multiprocessing.process.BaseProcess
    conn: Connection

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid


def _stop(workers: list[_Worker], blocks: list[SharedBlock], grace: float) -> None:
    """Close the pipes, give workers ``grace`` seconds to exit, kill the rest, free shared memory."""
    for w in workers:
        with contextlib.suppress(OSError):
            w.conn.send_bytes(_CLOSE)
    deadline = time.monotonic() + grace
    for w in workers:
        w.process.join(max(0.0, deadline - time.monotonic()))
        if w.process.is_alive():
            w.process.kill()
            w.process.join(5.0)
        w.conn.close()
    for block in blocks:
        block.close(unlink=True)


class AsyncBatchedEnv(BatchedEnv):
    """One subprocess per env; see :class:`BatchedEnv` for the API and the package doc for failures."""

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        step_timeout: float | None = 60.0,
        reset_timeout: float | None = 120.0,
        start_method: str | None = None,
        close_grace: float = 5.0,
        start_timeout: float | None = None,
    ) -> None:
        self._env_fns = env_fn_list(env_fns)
        self._ctx: Any = mp.get_context(start_method or default_start_method())
        if self._ctx.get_start_method() == "fork":
            raise ValueError("start_method='fork' is refused: EGL/CUDA contexts do not survive fork")
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(["cosmos_robot_envs.vector.worker"])
        self._close_grace = close_grace
        self._workers: list[_Worker] = []
        self._blocks: list[SharedBlock] = []
        self._finalizer = weakref.finalize(self, _stop, self._workers, self._blocks, close_grace)
        self._spaces: dict[str, Any] | None = None
        try:
            self._workers.extend(self._spawn(i) for i in range(len(self._env_fns)))
            if start_timeout is None and reset_timeout is not None:  # a first start also imports and builds
                start_timeout = max(reset_timeout, START_TIMEOUT_S)
            obs_space, act_space = self._await_first_ready(start_timeout)
            super().__init__(
                len(self._env_fns), obs_space, act_space, step_timeout=step_timeout, reset_timeout=reset_timeout
            )
            n, af = self.num_envs, self.action_layout.field
            self._obs_blocks = {k: SharedBlock((n, *f.shape), f.dtype) for k, f in self.obs_layout.arrays.items()}
            self._action_block = SharedBlock((n, *af.shape), af.dtype)
            self._blocks.extend([*self._obs_blocks.values(), self._action_block])
            self._arrays = {k: b.array for k, b in self._obs_blocks.items() if b.array is not None}
            obs_specs = {k: b.spec() for k, b in self._obs_blocks.items()}
            self._attach = pack({"cmd": "attach", "obs": obs_specs, "action": self._action_block.spec()})
            for w in self._workers:
                w.conn.send_bytes(self._attach)
        except BaseException:
            self._finalizer()
            raise

    @property
    def pids(self) -> list[int | None]:
        """Worker process ids, current as of the latest restart (tests and ops tooling use them)."""
        return [w.pid for w in self._workers]

    # -- worker life cycle -------------------------------------------------------------------------
    def _spawn(self, i: int) -> _Worker:
        fn = self._env_fns[i]
        if isinstance(fn, EnvFactory) and fn.python:
            process, conn = start_external_worker(fn.python, i, fn.env_id, fn.kwargs)
            return _Worker(process, conn)
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main, args=(i, self._env_fns[i], child), name=f"cosmos-env-{i}", daemon=True
        )
        try:
            process.start()
        except Exception as exc:
            parent.close()
            if not isinstance(exc, (AttributeError, TypeError)) and type(exc).__name__ != "PicklingError":
                raise
            raise TypeError(
                f"env factory {i} ({self._env_fns[i]!r}) cannot be sent to a worker process ({exc}); use an env id "
                "string, a module-level function or class, or functools.partial of one (not a lambda or closure)"
            ) from exc
        finally:
            child.close()
        return _Worker(process, parent)

    def _await_first_ready(self, timeout: float | None) -> tuple[Any, Any]:
        """Wait until every worker built its env; all must report the same spaces."""
        outcomes = self._collect(dict.fromkeys(range(len(self._workers)), "start"), timeout)
        failed = {i: o for i, o in outcomes.items() if isinstance(o, Failure)}
        if failed:
            details = "; ".join(f"env {i}: {o.reason}: {o.message}" for i, o in failed.items())
            raise RuntimeError(f"env workers failed to start: {details}")
        assert self._spaces is not None
        return space_from_data(self._spaces["observation_space"]), space_from_data(self._spaces["action_space"])

    def _restart(self, i: int) -> None:
        old = self._workers[i]
        if old.process.is_alive():
            old.process.kill()
        old.process.join(5.0)
        old.conn.close()
        self._workers[i] = new = self._spawn(i)
        new.conn.send_bytes(self._attach)  # queued in the pipe; read once the env is built

    # -- commands ----------------------------------------------------------------------------------
    def _run(self, commands: dict[int, Command], timeout: float | None) -> dict[int, Outcome]:
        payloads: dict[int, bytes] = {}
        for i, cmd in commands.items():
            if isinstance(cmd, ResetCmd):
                try:
                    payloads[i] = pack({"cmd": "reset", "seed": cmd.seed, "options": cmd.options})
                except WireError as exc:
                    raise TypeError(f"options of env {i} cannot be sent to its worker: {exc}") from exc
            else:
                self._action_block.array[i] = cmd.action  # type: ignore[index]
                payloads[i] = _STEP
        sent: dict[int, str] = {}
        outcomes: dict[int, Outcome] = {}
        for i, payload in payloads.items():
            try:
                self._workers[i].conn.send_bytes(payload)
                sent[i] = "reset" if isinstance(commands[i], ResetCmd) else "step"
            except OSError:
                outcomes[i] = self._crash(i)
        for i, answer in self._collect(sent, timeout).items():
            assert answer is not None  # only "start" answers None
            outcomes[i] = answer
        for i, outcome in outcomes.items():
            if isinstance(outcome, Failure):
                self._restart(i)
        return outcomes

    def _collect(self, pending: dict[int, str], timeout: float | None) -> dict[int, Outcome | None]:
        """Await each env's answer to ``pending[i]`` ("start" wants only the worker's "ready").

        Envs are awaited in turn against one deadline: the slowest env bounds the total either way,
        and a reply already waiting in its pipe costs a single poll.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        return {i: self._await(i, what, deadline, timeout) for i, what in pending.items()}

    def _await(self, i: int, what: str, deadline: float | None, timeout: float | None) -> Outcome | None:
        w = self._workers[i]
        while True:
            if not w.conn.poll():
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not wait([w.conn, w.process.sentinel], remaining):
                    message = f"env {i}: worker {w.pid} gave no reply to {what!r} within {timeout} s"
                    return Failure(WORKER_TIMEOUT, message)
            result = self._receive(i)
            if result is not None or what == "start":  # otherwise that was "ready": the reply follows
                return result

    def _receive(self, i: int) -> Outcome | None:
        w = self._workers[i]
        if not w.conn.poll():
            return self._crash(i)  # only the sentinel fired: the process is gone
        try:
            msg = unpack(w.conn.recv_bytes())
        except (EOFError, OSError):
            return self._crash(i)
        kind = msg.get("type")
        if kind == "ready":
            spaces = {k: msg[k] for k in ("observation_space", "action_space")}
            if self._spaces is None:
                self._spaces = spaces
            elif pack(spaces) != pack(self._spaces):
                return Failure(ENV_ERROR, f"env {i} reports different spaces than env 0; all envs must match")
            return None
        if kind == "error":
            return Failure(msg["reason"], msg["message"])
        return EnvReply.from_wire(msg)

    def _crash(self, i: int) -> Failure:
        w = self._workers[i]
        w.process.join(1.0)
        code = w.process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"signal {signal.Signals(-code).name}"
        return Failure(WORKER_CRASHED, f"env {i}: worker {w.pid} died ({how})")

    def _close(self) -> None:
        self._arrays, self._obs_blocks = {}, {}  # drop our views of shared memory before it is unmapped
        self._finalizer()
