"""Env workers that run under another Python interpreter (another venv), e.g. LIBERO's.

Why: some simulators pin libraries the rest of the stack cannot share. LIBERO's robosuite 1.4 needs
a mujoco older than 3.9, while our tabletop suite and its checkpoints use a newer one; both cannot
live in one venv. So an :class:`~cosmos_robot_envs.vector.EnvFactory` may name a ``python``: its
workers are started as ``<python> -m cosmos_robot_envs.vector.external`` in that venv (which has
this package and the simulator installed) instead of by ``multiprocessing``. Everything else is
the same worker: the same loop (:func:`~cosmos_robot_envs.vector.worker.worker_main`), the same
msgpack messages over a socket pair, the same shared-memory arrays, the same crash and hang
recovery. The factory itself crosses as data (env id and keyword arguments, msgpack), so nothing
is pickled even at start-up.

The child inherits the parent's environment variables (``MUJOCO_GL`` and friends) and nothing of
its ``sys.path``: it imports only what its own venv has installed.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import weakref
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["ExternalProcess", "start_external_worker"]


class ExternalProcess:
    """The parts of ``multiprocessing.Process`` the async backend uses, over a ``subprocess.Popen``.

    ``sentinel`` is a pidfd (readable once the process exits), so the backend's
    ``multiprocessing.connection.wait([conn, sentinel])`` works unchanged.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.sentinel: int = os.pidfd_open(popen.pid)
        weakref.finalize(self, os.close, self.sentinel)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()  # negative = killed by that signal, as multiprocessing reports it

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        if self.popen.poll() is None:
            # wait on the pidfd: Popen.wait(timeout) polls with sleeps of up to 50 ms
            select.select([self.sentinel], [], [], timeout)
            self.popen.poll()


def start_external_worker(python: str, index: int, env_id: str, kwargs: dict[str, Any]) -> tuple[Any, Connection]:
    """Start env worker ``index`` under ``python``; returns the process and the parent's connection."""
    from cosmos_robot_envs.vector.wire import pack

    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise FileNotFoundError(f"env {index}: the interpreter {python!r} for env {env_id!r} is not an executable file")
    parent, child = socket.socketpair()
    try:
        popen = subprocess.Popen(
            [python, "-m", "cosmos_robot_envs.vector.external", str(index), str(child.fileno())],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
    conn = Connection(parent.detach())
    conn.send_bytes(pack({"env_id": env_id, "kwargs": kwargs}))
    return ExternalProcess(popen), conn


def _main(argv: list[str]) -> None:
    from cosmos_robot_envs.vector.env_factory import EnvFactory
    from cosmos_robot_envs.vector.wire import unpack
    from cosmos_robot_envs.vector.worker import worker_main

    index, fd = int(argv[0]), int(argv[1])
    conn = Connection(fd)
    try:
        spec = unpack(conn.recv_bytes())
    except (EOFError, OSError):
        return  # the parent went away before we started
    worker_main(index, EnvFactory(spec["env_id"], spec["kwargs"]), conn, own_tracker=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
