"""AlpaSim driver service: any ``BasePolicy`` as the "driver" of NVIDIA's AlpaSim AV simulator.

AlpaSim's runtime is a gRPC client of ``egodriver.EgodriverService`` (our ``proto/egodriver.proto``
restates that contract); ``serve_alpasim(policy, host, port)`` answers it. See docs/alpasim.md.

The gRPC parts load lazily, so ``cosmos_robot_server`` (and this package's config and geometry) import
without grpcio/protobuf; using the service without them raises an ImportError that says
``pip install "cosmos-robot-server[alpasim]"``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cosmos_robot_server.alpasim.config import AlpasimDriverConfig
from cosmos_robot_server.alpasim.geometry import PlanError, PlannedPoses, plan_to_poses

if TYPE_CHECKING:
    from cosmos_robot_server.alpasim.server import AlpasimDriverServer, serve_alpasim
    from cosmos_robot_server.alpasim.servicer import AlpasimDriverServicer

__all__ = [
    "AlpasimDriverConfig",
    "AlpasimDriverServer",
    "AlpasimDriverServicer",
    "PlanError",
    "PlannedPoses",
    "plan_to_poses",
    "serve_alpasim",
]

_LAZY = {"AlpasimDriverServer": "server", "serve_alpasim": "server", "AlpasimDriverServicer": "servicer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"cosmos_robot_server.alpasim.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
