"""Request decoding off the event loop, shared by the websocket and ZMQ transports.

Why a pool of its own: msgpack's decoder is C code that holds the GIL, and even a payload within
``ServerConfig``'s decode bounds costs tens of milliseconds at worst; on the event loop that time
is stolen from every connection (pings, replies, other transports). Each transport therefore
decodes every request in a small thread pool of its own, never on the loop and never on the
policy thread (which must stay free for inference). The bounds (``DecodeLimits``) are what keep a
single decode short; the pool is what keeps the loop free while it runs.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cosmos_robot_client.codec import unpackb
from cosmos_robot_server.config import ServerConfig

__all__ = ["RequestDecoder"]

# decoding holds the GIL, so more threads add no throughput; two keep one big decode from queueing a small one
DECODE_THREADS = 2


class RequestDecoder:
    """``await decoder.decode(raw)``: ``unpackb`` with the server's bounds, in a worker thread."""

    def __init__(self, config: ServerConfig, name: str) -> None:
        self.limits = config.decode_limits
        self._pool = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix=f"{name}-decode")

    async def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """The decoded request; raises ``CodecError`` (``CodecLimitError`` for a bound) naming the problem."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._decode, data)

    def _decode(self, data: bytes | bytearray | memoryview) -> Any:
        return unpackb(data, limits=self.limits)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
