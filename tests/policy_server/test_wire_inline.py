"""Small requests are decoded on the event loop, everything else in the decode pool, with the same errors.

Why (issue 19): the hop to the pool and back cost ~0.1 ms of the ~0.3 ms by which the server trailed
openpi's for one client; a robot's observation (a few binary blobs) decodes in tens of microseconds.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from cosmos_robot_client.codec import CodecError, CodecLimitError, Packer
from cosmos_robot_server import ServerConfig
from cosmos_robot_server.wire import INLINE_MAX_BYTES, INLINE_MAX_ELEMENTS, RequestDecoder


def libero_request() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8),
        "prompt": "put the bowl on the plate",
    }


def decode_on(decoder: RequestDecoder, raw: bytes) -> tuple[object, bool]:
    """(decoded, whether it was decoded on the loop's thread)."""

    async def run() -> tuple[object, bool]:
        loop_thread = threading.get_ident()
        seen: list[int] = []
        original = decoder._decode

        def spy(data: bytes) -> object:
            seen.append(threading.get_ident())
            return original(data)

        decoder._decode = spy  # type: ignore[method-assign]
        try:
            before = decoder.inline_count
            out = await decoder.decode(raw)
            inline = decoder.inline_count == before + 1
            assert inline == (not seen) and all(t != loop_thread for t in seen)
            return out, inline
        finally:
            decoder._decode = original  # type: ignore[method-assign]

    return asyncio.run(run())


def test_a_robot_observation_is_decoded_on_the_loop() -> None:
    decoder = RequestDecoder(ServerConfig(), "ws")
    obs = libero_request()
    out, inline = decode_on(decoder, Packer().pack(obs))
    assert inline
    assert isinstance(out, dict)
    np.testing.assert_array_equal(out["observation/image"], obs["observation/image"])
    assert out["prompt"] == "put the bowl on the plate"
    decoder.close()


def test_many_objects_or_many_bytes_go_to_the_pool() -> None:
    decoder = RequestDecoder(ServerConfig(), "ws")
    many = {f"k{i}": i for i in range(INLINE_MAX_ELEMENTS)}  # 2 objects per entry: over the inline bound
    out, inline = decode_on(decoder, Packer().pack(many))
    assert not inline and out == many
    big = {"blob": np.zeros(INLINE_MAX_BYTES + 1, dtype=np.uint8)}
    out, inline = decode_on(decoder, Packer().pack(big))
    assert not inline and out["blob"].shape == (INLINE_MAX_BYTES + 1,)  # type: ignore[index]
    decoder.close()


def test_refusals_still_name_the_problem() -> None:
    decoder = RequestDecoder(ServerConfig(max_elements=1000), "ws")
    with pytest.raises(CodecLimitError, match="max_elements=1000"):
        decode_on(decoder, Packer().pack({"x": list(range(600)), "y": list(range(600))}))
    with pytest.raises(CodecError, match="malformed msgpack"):
        decode_on(decoder, b"\x81\xa1k")  # a map whose value is missing
    decoder.close()
