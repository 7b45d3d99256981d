"""cosmos-robot-client: the torch-free robot-side package (interface, wire codec, client policies)."""

from cosmos_robot_client.base_policy import BasePolicy, BatchPolicy, supports_batch
from cosmos_robot_client.codec import CodecError, packb, unpackb
from cosmos_robot_client.spec import ArraySpec, InputSpec, ObservationError, TextSpec

__all__ = [
    "ArraySpec",
    "BasePolicy",
    "BatchPolicy",
    "CodecError",
    "InputSpec",
    "ObservationError",
    "TextSpec",
    "packb",
    "supports_batch",
    "unpackb",
]
__version__ = "0.1.0"
