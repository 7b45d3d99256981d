"""Find the interpreter that runs LIBERO, and ask it for the suite catalog.

Looked up in this order (the first that exists wins):

1. ``$COSMOS_ROBOT_LIBERO_PYTHON``;
2. the current interpreter, when it has ``hf-libero`` and a mujoco older than 3.9 installed (a
   simulator container built for LIBERO only);
3. ``.venv-libero/bin/python`` in the working directory or one of its parents, or in the checkout
   this package was installed from (``make libero`` builds it there).

Nothing here imports LIBERO: the parent process of an evaluation never does.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "LiberoNotFound", "libero_catalog", "libero_python"]

ENV_VAR = "COSMOS_ROBOT_LIBERO_PYTHON"
VENV = ".venv-libero"


class LiberoNotFound(RuntimeError):
    """No usable LIBERO interpreter; the message says how to get one."""


def _here_can_run_libero() -> bool:
    try:
        importlib.metadata.version("hf-libero")
        mujoco = importlib.metadata.version("mujoco")
    except importlib.metadata.PackageNotFoundError:
        return False
    return tuple(int(p) for p in mujoco.split(".")[:2]) < (3, 9)


def _candidates() -> list[Path]:
    roots = [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[4]]
    return [root / VENV / "bin" / "python" for root in dict.fromkeys(roots)]


def libero_python() -> str:
    """The path of the interpreter that runs LIBERO envs (see the module docstring)."""
    override = os.environ.get(ENV_VAR)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise LiberoNotFound(f"${ENV_VAR}={override!r} is not an executable file")
        return override
    if _here_can_run_libero():
        return sys.executable
    for path in _candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise LiberoNotFound(
        f"no LIBERO interpreter: run `make libero` in the cosmos-robot checkout (it builds {VENV} with "
        f"hf-libero 0.1.4, robosuite 1.4.0, mujoco 3.8.1 and the asset wheels), or set ${ENV_VAR} to a "
        "python that has them and cosmos-robot-envs installed"
    )


@functools.lru_cache(maxsize=4)
def libero_catalog(python: str) -> dict[str, Any]:
    """``{suite: {"max_steps": int, "tasks": [{"name", "language"}, ...]}}`` as ``python`` sees it."""
    try:
        done = subprocess.run(
            [python, "-m", "cosmos_robot_envs.libero.catalog"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LiberoNotFound(f"LIBERO interpreter {python}: cannot list the suites ({exc})") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        raise LiberoNotFound(f"LIBERO interpreter {python} is not usable:\n{tail}")
    catalog: dict[str, Any] = json.loads(done.stdout)
    return catalog
