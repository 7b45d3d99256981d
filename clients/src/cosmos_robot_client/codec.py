"""msgpack-numpy wire codec, byte-compatible with openpi and readable from GR00T and lebedov peers.

Why msgpack and not pickle: a server must never execute what a client sends, and pickle executes
code on load. Every array on the wire is raw bytes plus a dtype string and a shape, checked before
use; object, void and complex dtypes are refused in both directions.

Encoding (``packb``) writes openpi's exact layout by default: an ndarray becomes the map
``{b"__ndarray__": True, b"data": bytes, b"dtype": dtype.str, b"shape": shape}`` with *bytes* keys
(msgpack bin), a numpy scalar becomes ``{b"__npgeneric__": True, b"data": item, b"dtype": str}``.
``dialect="gr00t"`` writes Isaac-GR00T's ``{"__ndarray_class__": True, "as_npy": <.npy bytes>}``.

Decoding (``unpackb``) accepts all of these dialects, whichever a peer speaks:

- openpi, with bytes keys (what its client sends) or str keys (what msgspec / JS peers send);
- lebedov ``msgpack-numpy`` and vLLM: ``{nd, type, kind, shape, data}`` (scalars with ``nd: False``);
- GR00T N1.5-N1.7: ``__ndarray_class__`` / ``as_npy`` (loaded with ``allow_pickle=False``) and
  ``__ModalityConfig_class__`` / ``as_json`` (returned as a plain dict).

Decoded arrays own writable memory (one copy), unlike openpi's read-only zero-copy views, so
transforms can modify them in place.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

import msgpack
import numpy as np

__all__ = ["CodecError", "Dialect", "Packer", "packb", "unpackb"]

Dialect = Literal["openpi", "gr00t"]

_REFUSED_KINDS = {"O": "object", "V": "void/structured", "c": "complex"}


class CodecError(ValueError):
    """A payload that cannot be encoded or decoded; the message names the problem."""


def _check_dtype(dtype: np.dtype, where: str) -> None:
    if dtype.kind in _REFUSED_KINDS or dtype.hasobject:
        kind = _REFUSED_KINDS.get(dtype.kind, "object")
        raise CodecError(
            f"{where}: dtype {dtype.str!r} ({kind}) is not allowed on the wire; "
            "send numeric, bool or fixed-width string arrays"
        )


def _pack_openpi(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype, "encode")
        return {
            b"__ndarray__": True,
            b"data": obj.tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype, "encode")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode object of type {type(obj).__name__} (only dict, list, str, bytes, numbers, numpy)")


def _pack_gr00t(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype, "encode")
        buf = io.BytesIO()
        np.save(buf, obj, allow_pickle=False)
        return {"__ndarray_class__": True, "as_npy": buf.getvalue()}
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype, "encode")
        return obj.item()
    raise TypeError(f"cannot encode object of type {type(obj).__name__} (only dict, list, str, bytes, numbers, numpy)")


_DEFAULTS = {"openpi": _pack_openpi, "gr00t": _pack_gr00t}


class Packer:
    """A reusable packer (cheaper than ``packb`` in a hot loop); not thread-safe, like msgpack's."""

    def __init__(self, dialect: Dialect = "openpi") -> None:
        if dialect not in _DEFAULTS:
            raise CodecError(f"unknown dialect {dialect!r}; expected one of {sorted(_DEFAULTS)}")
        self._packer = msgpack.Packer(default=_DEFAULTS[dialect], use_bin_type=True)

    def pack(self, obj: Any) -> bytes:
        try:
            return self._packer.pack(obj)
        except CodecError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"cannot encode payload: {exc}") from exc


def packb(obj: Any, *, dialect: Dialect = "openpi") -> bytes:
    """Encode ``obj`` (nested dicts/lists of numbers, str, bytes and numpy) as msgpack bytes."""
    return Packer(dialect).pack(obj)


def _get(obj: Mapping[Any, Any], key: str) -> Any:
    if key in obj:
        return obj[key]
    bkey = key.encode()
    if bkey in obj:
        return obj[bkey]
    raise CodecError(f"array map is missing the field {key!r}")


def _has(obj: Mapping[Any, Any], key: str) -> bool:
    return key in obj or key.encode() in obj


def _as_text(value: Any, field: str) -> str:
    if isinstance(value, bytes):
        return value.decode("ascii", errors="replace")
    if isinstance(value, str):
        return value
    raise CodecError(f"array field {field!r} must be a string, got {type(value).__name__}")


def _parse_dtype(value: Any) -> np.dtype:
    if not isinstance(value, (str, bytes)):
        raise CodecError(f"array field 'dtype' must be a dtype string like '<f4', got {type(value).__name__}")
    text = _as_text(value, "dtype")
    try:
        dtype = np.dtype(text)
    except TypeError as exc:
        raise CodecError(f"unknown dtype {text!r}") from exc
    _check_dtype(dtype, "decode")
    return dtype


def _parse_shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise CodecError(f"array field 'shape' must be a list of non-negative ints, got {value!r}")
    return tuple(value)


def _array_from_bytes(data: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"array field 'data' must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise CodecError(
            f"array data has {len(data)} bytes but shape {list(shape)} of dtype {dtype.str!r} needs {expected}"
        )
    if expected == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _decode_openpi(obj: Mapping[Any, Any]) -> np.ndarray:
    dtype = _parse_dtype(_get(obj, "dtype"))
    shape = _parse_shape(_get(obj, "shape"))
    return _array_from_bytes(_get(obj, "data"), dtype, shape)


def _decode_npgeneric(obj: Mapping[Any, Any]) -> np.generic:
    dtype = _parse_dtype(_get(obj, "dtype"))
    data = _get(obj, "data")
    try:
        return dtype.type(data)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"numpy scalar data {data!r} does not fit dtype {dtype.str!r}") from exc


def _decode_lebedov(obj: Mapping[Any, Any]) -> Any:
    kind = _as_text(obj.get("kind", obj.get(b"kind", b"")), "kind")
    if kind == "V":
        raise CodecError("decode: structured (void) arrays are not allowed on the wire")
    dtype = _parse_dtype(_get(obj, "type"))
    data = _get(obj, "data")
    if not _get(obj, "nd"):
        return _array_from_bytes(data, dtype, ())[()]
    return _array_from_bytes(data, dtype, _parse_shape(_get(obj, "shape")))


def _decode_npy(obj: Mapping[Any, Any]) -> np.ndarray:
    blob = _get(obj, "as_npy")
    if not isinstance(blob, (bytes, bytearray)):
        raise CodecError("GR00T array field 'as_npy' must hold .npy bytes")
    if bytes(blob[:6]) != b"\x93NUMPY":  # np.load would otherwise try pickle / return an .npz archive
        raise CodecError("GR00T array field 'as_npy' is not a valid .npy file (missing the \\x93NUMPY magic)")
    try:
        arr = np.load(io.BytesIO(blob), allow_pickle=False)
    except ValueError as exc:  # raised for object arrays, which would need pickle
        raise CodecError(f"GR00T array refused: {exc}") from exc
    except (OSError, EOFError) as exc:
        raise CodecError(f"GR00T array field 'as_npy' is not a valid .npy file: {exc}") from exc
    _check_dtype(arr.dtype, "decode")
    return arr


def _decode_modality_config(obj: Mapping[Any, Any]) -> Any:
    payload = _get(obj, "as_json")
    if isinstance(payload, (str, bytes)):  # N1.5 sends a JSON string, N1.6+ a map
        try:
            return json.loads(payload)
        except json.JSONDecodeError as exc:
            raise CodecError(f"GR00T modality config is not valid JSON: {exc}") from exc
    return payload


def _object_hook(obj: dict[Any, Any]) -> Any:
    if _has(obj, "__ndarray__"):
        return _decode_openpi(obj)
    if _has(obj, "__npgeneric__"):
        return _decode_npgeneric(obj)
    if _has(obj, "__ndarray_class__"):
        return _decode_npy(obj)
    if _has(obj, "__ModalityConfig_class__"):
        return _decode_modality_config(obj)
    if _has(obj, "nd") and _has(obj, "type") and _has(obj, "data"):
        return _decode_lebedov(obj)
    return obj


def unpackb(data: bytes | bytearray | memoryview) -> Any:
    """Decode msgpack bytes from any supported dialect; raises ``CodecError`` naming the problem."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected a binary msgpack payload, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, object_hook=_object_hook, raw=False, strict_map_key=False)
    except CodecError:
        raise
    except msgpack.ExtraData as exc:
        raise CodecError("malformed msgpack: trailing bytes after the payload") from exc
    except (ValueError, TypeError, msgpack.UnpackException, UnicodeDecodeError) as exc:
        raise CodecError(f"malformed msgpack payload ({type(exc).__name__}: {exc})") from exc
