"""Test helpers shared across the suite (no policy logic here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OPENPI_PY = REPO / ".venv-openpi" / "bin" / "python"


def openpi_python() -> Path:
    """The interpreter of the venv holding the real openpi-client/openpi-server from PyPI.

    Skips when it is missing, unless COSMOS_ROBOT_REQUIRE_OPENPI=1 (set by `make test`) makes
    that a failure, so CI can never silently skip the compatibility tests.
    """
    if OPENPI_PY.exists():
        return OPENPI_PY
    message = f"{OPENPI_PY} missing; `make test` creates it (openpi-client 0.1.2 needs numpy<2)"
    if os.environ.get("COSMOS_ROBOT_REQUIRE_OPENPI") == "1":
        pytest.fail(message)
    pytest.skip(message)


def run_python(python: Path | str, code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


PY = sys.executable


def libero_python() -> str:
    """The LIBERO venv's interpreter (``make libero``); skips without it unless COSMOS_ROBOT_REQUIRE_LIBERO=1."""
    from cosmos_robot_envs.libero import LiberoNotFound
    from cosmos_robot_envs.libero import libero_python as find

    try:
        return find()
    except LiberoNotFound as exc:
        if os.environ.get("COSMOS_ROBOT_REQUIRE_LIBERO") == "1":
            pytest.fail(f"{exc} (COSMOS_ROBOT_REQUIRE_LIBERO=1 forbids skipping)")
        pytest.skip(str(exc))
