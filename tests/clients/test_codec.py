"""The wire codec: openpi byte-compatibility, the other dialects, refusals with clear messages."""

from __future__ import annotations

import io
import json

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from cosmos_robot_client.codec import CodecError, Packer, packb, unpackb
from tests.clients.codec_sample import sample_obs
from tests.helpers import REPO, openpi_python, run_python

ARRAYS = {
    "u8_image": np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3),
    "f4": np.linspace(-1, 1, 7, dtype=np.float32),
    "f8_state": np.arange(8, dtype=np.float64),
    "f2": np.ones((2, 2), dtype=np.float16),
    "i8": np.array([-(2**62), 2**62], dtype=np.int64),
    "bool": np.array([True, False, True]),
    "zero_d": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 7), dtype=np.float32),
    "empty_mid": np.zeros((3, 0, 2), dtype=np.int16),
    "big_endian": np.arange(6, dtype=">f4").reshape(2, 3),
    "big_endian_i4": np.arange(4, dtype=">i4"),
    "unicode": np.array(["ab", "xyz"]),
    "non_contiguous": np.arange(48, dtype=np.int32).reshape(4, 12)[::2, ::-3],
    "fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("dialect", ["openpi", "gr00t"])
def test_array_round_trip_keeps_values_dtype_shape(name: str, dialect: str) -> None:
    arr = ARRAYS[name]
    out = unpackb(packb({"x": arr, "nested": [arr, {"y": arr}]}, dialect=dialect))  # type: ignore[arg-type]
    for got in (out["x"], out["nested"][0], out["nested"][1]["y"]):
        assert isinstance(got, np.ndarray)
        assert got.dtype == arr.dtype and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)
        assert got.flags.writeable
        got[...] = got  # writable in place
    assert out["x"] is not out["nested"][0]


def test_scalars_and_plain_values_round_trip() -> None:
    payload = {
        "prompt": "pick up the bowl",
        "flag": np.True_,
        "f32": np.float32(1.25),
        "i64": np.int64(-3),
        "py": [1, 2.5, None, "s", b"raw"],
    }
    out = unpackb(packb(payload))
    assert out["prompt"] == "pick up the bowl"
    assert out["flag"] is np.True_ or out["flag"] == np.True_
    assert isinstance(out["f32"], np.float32) and out["f32"] == np.float32(1.25)
    assert isinstance(out["i64"], np.int64) and out["i64"] == -3
    assert out["py"] == [1, 2.5, None, "s", b"raw"]


def test_openpi_layout_uses_bytes_keys_in_order() -> None:
    raw = packb(np.zeros(2, dtype=np.uint8))
    assert raw.startswith(b"\x84\xc4\x0b__ndarray__\xc3\xc4\x04data")
    decoded = msgpack.unpackb(raw, raw=False)
    assert list(decoded) == [b"__ndarray__", b"data", b"dtype", b"shape"]
    assert decoded[b"dtype"] == "|u1" and decoded[b"shape"] == [2]


def test_string_keyed_openpi_variant_decodes() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = msgpack.packb({"a": {"__ndarray__": True, "data": arr.tobytes(), "dtype": "<f4", "shape": [2, 3]}})
    np.testing.assert_array_equal(unpackb(raw)["a"], arr)
    raw = msgpack.packb({"s": {"__npgeneric__": True, "data": 7, "dtype": "<i4"}})
    assert unpackb(raw)["s"] == np.int32(7)


def test_an_array_map_with_both_key_kinds_is_read_by_str_keys_as_before() -> None:
    """str keys win over bytes duplicates, so a stranger cannot slip a refused dtype past the check by
    doubling the keys."""
    ints = np.array([0, 1], dtype="<i4")
    mixed = {b"__ndarray__": True, b"dtype": "<f4", b"shape": [2], b"data": np.zeros(2, "<f4").tobytes()}
    raw = msgpack.packb({"a": {**mixed, "dtype": "<i4", "shape": [2], "data": ints.tobytes()}}, use_bin_type=True)
    out = unpackb(raw)["a"]
    assert out.dtype == np.int32 and out.tolist() == [0, 1]
    raw = msgpack.packb({"a": {**mixed, "dtype": "|O", "shape": [2], "data": b"\0" * 16}}, use_bin_type=True)
    with pytest.raises(CodecError, match="not allowed on the wire"):
        unpackb(raw)


def test_dtype_strings_are_parsed_once_and_only_numeric_canonical_ones_are_kept() -> None:
    from cosmos_robot_client import codec

    for text in ("<f4", b"|u1", "f4", "<U3", "|S2"):
        arr = np.zeros(2, dtype=np.dtype(text if isinstance(text, str) else text.decode()))
        raw = msgpack.packb({"__ndarray__": True, "data": arr.tobytes(), "dtype": text, "shape": [2]})
        assert unpackb(raw).dtype == arr.dtype
    assert {"<f4", b"|u1"} <= set(codec._DTYPES)
    assert not {"f4", "<U3", "|S2"} & set(codec._DTYPES)  # a spelling, not canonical; strings: not numeric


def test_lebedov_msgpack_numpy_dialect_from_the_real_package() -> None:
    payload = {"img": ARRAYS["u8_image"], "state": ARRAYS["f8_state"], "s": np.float32(2.0), "t": "txt"}
    raw = msgpack.packb(payload, default=msgpack_numpy.encode)
    out = unpackb(raw)
    np.testing.assert_array_equal(out["img"], payload["img"])
    np.testing.assert_array_equal(out["state"], payload["state"])
    assert out["s"] == np.float32(2.0) and out["t"] == "txt"


def test_vllm_style_kind_char_variant_decodes() -> None:
    arr = np.arange(4, dtype=np.int16)
    raw = msgpack.packb({"nd": True, "type": "<i2", "kind": "i", "shape": [4], "data": arr.tobytes()})
    np.testing.assert_array_equal(unpackb(raw), arr)


def test_gr00t_npy_and_modality_config_decode() -> None:
    buf = io.BytesIO()
    arr = np.arange(12, dtype=np.float32).reshape(1, 1, 12)
    np.save(buf, arr, allow_pickle=False)
    cfg = {"delta_indices": [0], "modality_keys": ["x"]}
    raw = msgpack.packb(
        {
            "state.x": {"__ndarray_class__": True, "as_npy": buf.getvalue()},
            "mc16": {"__ModalityConfig_class__": True, "as_json": cfg},
            "mc15": {"__ModalityConfig_class__": True, "as_json": json.dumps(cfg)},
        }
    )
    out = unpackb(raw)
    np.testing.assert_array_equal(out["state.x"], arr)
    assert out["mc16"] == cfg and out["mc15"] == cfg
    assert out["state.x"].flags.writeable


def test_gr00t_dialect_writes_npy_maps() -> None:
    raw = packb({"a": np.ones(3, dtype=np.float32)}, dialect="gr00t")
    decoded = msgpack.unpackb(raw, raw=False)
    assert set(decoded["a"]) == {"__ndarray_class__", "as_npy"}
    np.testing.assert_array_equal(np.load(io.BytesIO(decoded["a"]["as_npy"]), allow_pickle=False), np.ones(3))


@pytest.mark.parametrize(
    "value",
    [np.array([object(), 1], dtype=object), np.zeros(2, dtype=[("a", "<f4")]), np.ones(2, dtype=np.complex64)],
    ids=["object", "void", "complex"],
)
@pytest.mark.parametrize("dialect", ["openpi", "gr00t"])
def test_encode_refuses_unsafe_dtypes(value: np.ndarray, dialect: str) -> None:
    with pytest.raises(CodecError, match="not allowed on the wire"):
        packb({"x": value}, dialect=dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["|O", "O", "<c8", "|V8", "object"])
def test_decode_refuses_unsafe_dtypes(dtype: str) -> None:
    raw = msgpack.packb({b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": dtype, b"shape": [1]})
    with pytest.raises(CodecError, match="not allowed on the wire"):
        unpackb(raw)


def test_decode_refuses_pickled_npy_and_lebedov_void() -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CodecError, match="refused"):
        unpackb(msgpack.packb({"__ndarray_class__": True, "as_npy": buf.getvalue()}))
    raw = msgpack.packb({b"nd": True, b"type": [["a", "<f4"]], b"kind": b"V", b"shape": [1], b"data": b"\x00" * 4})
    with pytest.raises(CodecError, match="void"):
        unpackb(raw)


def test_decode_errors_name_the_problem() -> None:
    good = packb({"x": np.zeros((2, 2), dtype=np.float32)})
    with pytest.raises(CodecError, match="malformed msgpack"):
        unpackb(good[:-5])
    with pytest.raises(CodecError, match="trailing bytes"):
        unpackb(good + b"\x00")
    bad_len = msgpack.packb({b"__ndarray__": True, b"data": b"\x00" * 3, b"dtype": "<f4", b"shape": [2]})
    with pytest.raises(CodecError, match=r"3 bytes but shape \[2\] of dtype '<f4' needs 8"):
        unpackb(bad_len)
    bad_shape = msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [-1]})
    with pytest.raises(CodecError, match="shape"):
        unpackb(bad_shape)
    missing = msgpack.packb({b"__ndarray__": True, b"dtype": "<f4", b"shape": [0]})
    with pytest.raises(CodecError, match="'data'"):
        unpackb(missing)
    with pytest.raises(CodecError, match="unknown dtype"):
        unpackb(msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "nope", b"shape": [0]}))
    with pytest.raises(CodecError, match="binary"):
        unpackb("text")  # type: ignore[arg-type]


def test_unencodable_python_objects_are_named() -> None:
    with pytest.raises(CodecError, match="set"):
        packb({"x": {1, 2}})
    with pytest.raises(CodecError):
        Packer().pack(2**70)


# run from the repository root, so that ``tests`` is importable there too
OPENPI_PACK = """
import sys
from openpi_client import msgpack_numpy
from tests.clients.codec_sample import sample_obs
sys.stdout.buffer.write(msgpack_numpy.packb(sample_obs()))
"""


def test_bytes_identical_to_real_openpi_client_and_decodable_by_it() -> None:
    import subprocess

    py = openpi_python()
    theirs = subprocess.run([str(py), "-c", OPENPI_PACK], capture_output=True, timeout=60, check=True, cwd=REPO).stdout
    obs = sample_obs()
    assert packb(obs) == theirs
    decoded = unpackb(theirs)
    np.testing.assert_array_equal(decoded["observation/image"], obs["observation/image"])
    # ...and openpi's own decoder reads what we write (the server's replies).
    ours = packb({"actions": np.ones((10, 7), dtype=np.float32), "server_timing": {"infer_ms": 1.0}})
    check = (
        "import sys; from openpi_client import msgpack_numpy as m; d = m.unpackb(sys.stdin.buffer.read()); "
        "print(d['actions'].shape, d['actions'].dtype, d['server_timing']['infer_ms'])"
    )
    res = subprocess.run([str(py), "-c", check], input=ours, capture_output=True, timeout=60, check=True)
    assert res.stdout.decode().split() == ["(10,", "7)", "float32", "1.0"]
    assert run_python(py, "import openpi_client").returncode == 0
