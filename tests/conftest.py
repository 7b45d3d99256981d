"""Shared test setup: offline hub, headless GL, and a helper to run a policy server in a thread."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
# One intra-op thread per process: on a 2-core box torch's default of 2 collapses when envs,
# servers and other tests run beside it (measured 2-4x slower); set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def pb() -> Any:
    """The generated AlpaSim gRPC modules (skips without grpcio, the policy server's [alpasim] extra)."""
    pytest.importorskip("grpc")
    from cosmos_robot_server.alpasim.proto import common_pb2, egodriver_pb2, egodriver_pb2_grpc, sensorsim_pb2

    class PB:
        common, ego, grpc_mod, sensorsim = common_pb2, egodriver_pb2, egodriver_pb2_grpc, sensorsim_pb2

    return PB
