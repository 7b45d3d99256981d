"""The loop inside one env worker process (started with ``spawn`` or ``forkserver``, never ``fork``).

Why this protocol: the parent must be able to kill and replace a worker at any moment without
corrupting the others, so each worker owns one pipe and one row of every shared-memory block.
Messages are msgpack (:mod:`cosmos_robot_envs.vector.wire`) via ``send_bytes`` / ``recv_bytes``: nothing is
unpickled after start-up. Arrays (observations, actions) go through shared memory; only the reward,
flags, info and text fields travel in the reply.

Messages, parent -> worker: ``{"cmd": "attach", "obs": {key: [shm_name, shape, dtype]},
"action": [shm_name, shape, dtype]}`` once, then ``reset`` (``seed``, ``options``), ``step`` (the
action is in shared memory) or ``close``. Worker -> parent: ``{"type": "ready", "pid",
"observation_space", "action_space"}`` after building the env, then one ``{"type": "reply", ...}``
(see :meth:`EnvReply.to_wire`) or ``{"type": "error", "reason", "message"}`` per command.
"""

from __future__ import annotations

import contextlib
import os
import signal
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from cosmos_robot_envs.vector.runner import ENV_ERROR, EnvFn, EnvReply, EnvRunner, describe_exception
from cosmos_robot_envs.vector.wire import WireError, pack, unpack

__all__ = ["SharedBlock", "worker_main"]


class SharedBlock:
    """A (num_envs, *shape) array in a named shared-memory segment, created here or attached by name."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, name: str | None = None) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize)
        self.shm = SharedMemory(name=name, create=name is None, size=nbytes if name is None else 0)
        self.array: np.ndarray | None = np.ndarray(shape, dtype=self.dtype, buffer=self.shm.buf)

    def spec(self) -> list[Any]:
        return [self.shm.name, list(self.shape), self.dtype.str]

    @classmethod
    def attach(cls, spec: list[Any], *, track: bool = True) -> SharedBlock:
        """Map a block the parent created. ``track=False`` in a process with its own resource tracker
        (an external worker): that tracker would otherwise unlink the parent's segment when the
        worker exits."""
        name, shape, dtype = spec
        block = cls(tuple(shape), np.dtype(dtype), name)
        if not track:
            from multiprocessing import resource_tracker

            resource_tracker.unregister(block.shm._name, "shared_memory")  # type: ignore[attr-defined]
        return block

    def close(self, unlink: bool = False) -> None:
        self.array = None  # drop the numpy view first, or the segment cannot be unmapped
        with contextlib.suppress(BufferError, OSError):
            self.shm.close()
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


def _send(conn: Connection, msg: dict[str, Any], index: int) -> None:
    try:
        payload = pack(msg)
    except WireError as exc:
        payload = pack(
            {
                "type": "error",
                "reason": ENV_ERROR,
                "message": f"env {index}: its info or text observation cannot cross the process boundary ({exc}); "
                "info values must be numbers, str, bool, None, numpy arrays/scalars, lists or dicts",
            }
        )
    conn.send_bytes(payload)


def worker_main(index: int, env_fn: EnvFn, conn: Connection, *, own_tracker: bool = False) -> None:
    """Build the env, report its spaces, then serve commands until ``close`` or the parent goes away.

    ``own_tracker``: this process was not started by ``multiprocessing`` (so it does not share the
    parent's resource tracker) and must not let its tracker claim the shared memory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    try:
        runner = EnvRunner(env_fn, index)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        _send(
            conn,
            {"type": "error", "reason": ENV_ERROR, "message": "building the env failed:\n" + describe_exception(exc)},
            index,
        )
        return
    _send(conn, {"type": "ready", "pid": os.getpid(), **runner.spaces_message()}, index)
    obs_blocks: dict[str, SharedBlock] = {}
    action_block: SharedBlock | None = None
    try:
        while True:
            try:
                msg = unpack(conn.recv_bytes())
            except (EOFError, OSError):
                return  # the parent closed the pipe or died
            cmd = msg["cmd"]
            if cmd == "close":
                return
            if cmd == "attach":
                track = not own_tracker
                obs_blocks = {k: SharedBlock.attach(spec, track=track) for k, spec in msg["obs"].items()}
                action_block = SharedBlock.attach(msg["action"], track=track)
                continue
            try:
                if cmd == "reset":
                    reply: EnvReply = runner.reset(msg["seed"], msg["options"])
                else:
                    assert action_block is not None and action_block.array is not None
                    reply = runner.step(action_block.array[index].copy())
                for key, value in reply.arrays.items():
                    block = obs_blocks[key].array
                    assert block is not None
                    np.copyto(block[index], value, casting="same_kind")
            except Exception as exc:  # noqa: BLE001 - the parent reports it and replaces this worker
                _send(conn, {"type": "error", "reason": ENV_ERROR, "message": describe_exception(exc)}, index)
                continue
            reply.arrays = {}
            _send(conn, {"type": "reply", **reply.to_wire()}, index)
    finally:
        with contextlib.suppress(Exception):
            runner.close()
        for shared in [*obs_blocks.values(), *([action_block] if action_block else [])]:
            shared.close()
