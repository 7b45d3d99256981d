"""The codec against hostile payloads: structure bounds checked before decoding, decoder bombs named.

Every payload here once escaped as an ``OverflowError``, ``MemoryError`` or ``RecursionError`` (or
froze a server for seconds); each must now be a ``CodecError`` that names the field and the
problem, found fast, without allocating what a header merely claims.
"""

from __future__ import annotations

import io
import random
import struct
import time
from typing import Any

import msgpack
import numpy as np
import pytest

from cosmos_robot_client.codec import (
    CodecError,
    CodecLimitError,
    DecodeLimits,
    check_structure,
    packb,
    unpackb,
)
from tests.clients.codec_sample import sample_obs


def npy_with_header(header: str, payload: bytes = bytes(16)) -> bytes:
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def npy_map(blob: bytes) -> dict[str, Any]:
    return {"__ndarray_class__": True, "as_npy": blob}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def count_objects(obj: Any) -> int:
    if isinstance(obj, dict):
        return 1 + sum(count_objects(k) + count_objects(v) for k, v in obj.items())
    if isinstance(obj, list):
        return 1 + sum(count_objects(v) for v in obj)
    return 1


def test_scan_counts_every_msgpack_type_exactly() -> None:
    rng = random.Random(0)
    values: list[Any] = [None, True, 1, -1, 200, -200, 70000, -70000, 2**40, -(2**40), 1.5, "s", "x" * 40]
    values += ["y" * 300, "z" * 70000, b"b", b"q" * 300, b"w" * 70000, msgpack.ExtType(1, b"a"), [], {}]
    values += [msgpack.ExtType(2, b"ab" * 200), msgpack.ExtType(3, b"abcd"), list(range(20))]
    values += [{str(i): i for i in range(20)}]
    for _ in range(30):
        items = [rng.choice(values) for _ in range(rng.randint(0, 10))]
        obj = {"a": items, "b": [{"c": items}]}
        assert check_structure(msgpack.packb(obj, use_bin_type=True)) == count_objects(obj)
    wide = {"m": dict.fromkeys(range(70000), 0), "l": [0] * 70000}  # 32-bit map and array counts
    limits = DecodeLimits(max_map_keys=10**5, max_list_items=10**5, max_elements=10**6)
    assert check_structure(msgpack.packb(wide), limits) == 210_005


def test_real_observations_fit_the_default_limits() -> None:
    obs = sample_obs()
    batch = {"batch": [obs] * 64}
    out = unpackb(packb(batch))
    assert len(out["batch"]) == 64
    assert check_structure(packb(batch)) < DecodeLimits().max_elements // 10


@pytest.mark.parametrize(
    ("payload", "limit"),
    [
        ({f"k{i}": i for i in range(3_000)}, "max_map_keys=1024"),
        ({"batch": [{"x": 1}] * 3_200}, "3200 items, over max_list_items=1024"),
        ([{f"k{i}": 1 for i in range(1000)} for _ in range(60)], "max_elements=100000"),
        (nested(40), "max_depth=32"),
    ],
    ids=["keys", "list", "elements", "depth"],
)
def test_structure_over_a_limit_is_refused_by_name(payload: Any, limit: str) -> None:
    with pytest.raises(CodecLimitError, match=limit):
        unpackb(msgpack.packb(payload))


def test_huge_map_is_refused_before_it_is_decoded() -> None:
    raw = msgpack.packb(dict.fromkeys(range(400_000), 1))  # 400k keys took 0.6 s to decode and validate
    t0 = time.perf_counter()
    with pytest.raises(CodecLimitError, match="400000 keys, over max_map_keys=1024"):
        unpackb(raw)
    assert time.perf_counter() - t0 < 0.05
    deep = b"\x91" * 100_000 + b"\xc0"  # 100k nested lists
    with pytest.raises(CodecLimitError, match="max_depth"):
        unpackb(deep)


def test_limits_are_configurable_and_validated() -> None:
    raw = msgpack.packb({f"k{i}": i for i in range(50)})
    assert len(unpackb(raw)) == 50
    with pytest.raises(CodecLimitError, match="max_map_keys=10"):
        unpackb(raw, limits=DecodeLimits(max_map_keys=10))
    with pytest.raises(CodecLimitError, match="max_elements=20"):
        unpackb(raw, limits=DecodeLimits(max_elements=20))
    with pytest.raises(ValueError, match="DecodeLimits.max_depth"):
        DecodeLimits(max_depth=0)


def test_scalar_overflow_is_named() -> None:
    raw = msgpack.packb({"x": {"__npgeneric__": True, "data": 1000, "dtype": "|i1"}})
    with pytest.raises(CodecError, match=r"\['x'\]: numpy scalar data 1000 does not fit dtype '\|i1'"):
        unpackb(raw)
    raw = msgpack.packb({"x": {"__npgeneric__": True, "data": [1, 2, 3], "dtype": "<f4"}})
    with pytest.raises(CodecError, match="must be a number, bool or string, got list"):
        unpackb(raw)


def test_npy_header_claiming_terabytes_is_refused_before_allocation() -> None:
    blob = npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2199023255552,), }")
    raw = msgpack.packb({"obs": {"video": npy_map(blob)}})
    with pytest.raises(CodecError, match=r"\['obs'\]\['video'\]: array data has 16 bytes .* needs 8796093022208"):
        unpackb(raw)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", "GR00T array refused: dtype '|O'"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", "non-negative ints"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, }", "bad .npy header"),
        ("{'descr': '<f4', 'shape': (4,), }", "bad .npy header"),
        ("{'descr': 'nonsense', 'fortran_order': False, 'shape': (4,), }", "bad .npy header"),
    ],
    ids=["object", "negative", "syntax", "missing_key", "bad_dtype"],
)
def test_bad_npy_headers_are_named(header: str, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        unpackb(msgpack.packb({"x": npy_map(npy_with_header(header))}))


def test_npy_fortran_order_and_version_2_decode_like_np_load() -> None:
    arr = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=(2, 0))
    out = unpackb(msgpack.packb({"x": npy_map(buf.getvalue())}))["x"]
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable


def test_modality_config_bombs_are_named() -> None:
    deep = msgpack.packb({"cfg": {"__ModalityConfig_class__": True, "as_json": "[" * 100000}})
    with pytest.raises(CodecLimitError, match=r"\['cfg'\]: GR00T modality config JSON nests too deeply"):
        unpackb(deep)
    big = msgpack.packb({"__ModalityConfig_class__": True, "as_json": " " * (2 * 1024 * 1024)})
    with pytest.raises(CodecLimitError, match="over max_json_bytes"):
        unpackb(big)


def test_error_names_the_path_inside_lists() -> None:
    bad = {"__ndarray__": True, "data": b"abc", "dtype": "<f4", "shape": [2]}
    raw = msgpack.packb({"batch": [{"ok": 1}, {"observation/image": bad}]})
    with pytest.raises(CodecError, match=r"^\['batch'\]\[1\]\['observation/image'\]: array data has 3 bytes"):
        unpackb(raw)


@pytest.mark.parametrize("dtype", ["U99999999999999999999", "(2,)i4", "i4,i4", "M8[zz]"])
def test_hostile_dtype_strings_are_codec_errors(dtype: str) -> None:
    raw = msgpack.packb({"__ndarray__": True, "data": b"", "dtype": dtype, "shape": [0]})
    with pytest.raises(CodecError):
        unpackb(raw)
