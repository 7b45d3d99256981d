"""cosmos-robot-server: serve any ``BasePolicy`` over openpi websocket, GR00T ZMQ and HTTP."""

from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.core import RequestError, ServingCore
from cosmos_robot_server.metrics import Metrics
from cosmos_robot_server.server import PolicyServer
from cosmos_robot_server.transport import Transport

__all__ = ["Metrics", "PolicyServer", "RequestError", "ServerConfig", "ServingCore", "Transport"]
__version__ = "0.1.0"
