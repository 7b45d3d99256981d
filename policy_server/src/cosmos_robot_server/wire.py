"""Request decoding, shared by the websocket and ZMQ transports: small requests on the loop, the rest
in a pool of its own.

Why a pool: msgpack's decoder is C code that holds the GIL, and a payload within ``ServerConfig``'s
decode bounds can cost tens of milliseconds (100,000 objects); on the event loop that time is stolen
from every connection (pings, replies, other transports). So a request is decoded in a small thread
pool, never on the policy thread (which must stay free for inference).

Why not always: the hop to a pool thread and back costs about 0.1 ms on a 2-core machine (measured:
a 300 KB LIBERO request decodes in 72 us, and takes 187 us through the pool), a third of the server's
whole transport overhead for one client. A robot's observation is a small tree whose bulk is a few
binary blobs, so its decoding is bounded by its byte size: a request of at most ``INLINE_MAX_BYTES``
holding at most ``INLINE_MAX_ELEMENTS`` objects (keys, values, items) and no JSON string over
``INLINE_MAX_JSON_BYTES`` is decoded on the loop, at most
a fraction of a millisecond; the structure scan that decides it stops at the first object past the
bound (so a hostile request costs the loop at most that scan) and is the same scan the decoder runs
anyway. Anything larger, or any request the scan refuses, goes to the pool with the server's full
``DecodeLimits``, as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cosmos_robot_client.codec import CodecError, unpackb
from cosmos_robot_server.config import ServerConfig

__all__ = ["INLINE_MAX_BYTES", "INLINE_MAX_ELEMENTS", "RequestDecoder"]

# decoding holds the GIL, so more threads add no throughput; two keep one big decode from queueing a small one
DECODE_THREADS = 2
INLINE_MAX_BYTES = 1 << 20  # two 224 px images and a state are 0.3 MB; a memcpy of 1 MB is ~0.1 ms
INLINE_MAX_ELEMENTS = 256  # a LIBERO request holds ~30 objects, a GR00T N1.6 request ~60
INLINE_MAX_JSON_BYTES = 64 * 1024  # a GR00T N1.5 modality config parsed on the loop (json.loads: ~0.3 ms)


class RequestDecoder:
    """``await decoder.decode(raw)``: ``unpackb`` with the server's bounds, on the loop when small."""

    def __init__(self, config: ServerConfig, name: str) -> None:
        self.limits = config.decode_limits
        self.inline_limits = dataclasses.replace(
            self.limits,
            max_elements=min(INLINE_MAX_ELEMENTS, self.limits.max_elements),
            max_json_bytes=min(INLINE_MAX_JSON_BYTES, self.limits.max_json_bytes),
        )
        self._pool = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix=f"{name}-decode")
        self.inline_count = 0  # requests decoded on the loop (tests, metrics)

    async def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """The decoded request; raises ``CodecError`` (``CodecLimitError`` for a bound) naming the problem."""
        if len(data) <= INLINE_MAX_BYTES:
            try:
                decoded = unpackb(data, limits=self.inline_limits)
            except CodecError:
                pass  # over the inline bound, or malformed: the pool decodes it with the full limits and says which
            else:
                self.inline_count += 1
                return decoded
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._decode, data)

    def _decode(self, data: bytes | bytearray | memoryview) -> Any:
        return unpackb(data, limits=self.limits)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
