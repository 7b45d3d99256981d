"""``Transport``: the base of every network endpoint (websocket, ZMQ, HTTP) in front of the core.

Why a module of its own: ``server.PolicyServer`` opens transports and each transport module
subclasses this; keeping the base here means the transports never import the server (no import cycle).
"""

from __future__ import annotations

import abc

from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.core import ServingCore

__all__ = ["TRANSPORTS", "Transport"]

# transport name -> "module:Class", imported when asked for (a missing optional dependency only
# affects that transport)
TRANSPORTS = {
    "ws": "cosmos_robot_server.websocket_server:WebsocketTransport",
    "zmq": "cosmos_robot_server.zmq_server:ZmqTransport",
    "http": "cosmos_robot_server.http_server:HttpTransport",
}


class Transport(abc.ABC):
    """One network endpoint in front of the shared core."""

    name: str = ""

    def __init__(self, core: ServingCore, config: ServerConfig) -> None:
        self.core = core
        self.config = config

    @abc.abstractmethod
    async def start(self) -> int:
        """Bind and begin serving; return the bound TCP port."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop accepting, close connections, release the port."""
