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

Why decoding is defensive beyond "no pickle": a server decodes what strangers send, and msgpack's
C decoder holds the GIL, so one crafted frame can freeze every client. ``unpackb`` therefore scans
the raw bytes against ``DecodeLimits`` (keys per map, total objects, depth) before building
anything, checks every array header (dtype allowed, shape x itemsize equal to the bytes present)
before allocating, and turns every failure into a ``CodecError`` that names the field, never an
``OverflowError``, ``MemoryError`` or ``RecursionError`` from deep inside numpy or json.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
import numpy as np

__all__ = [
    "DEFAULT_LIMITS",
    "CodecError",
    "CodecLimitError",
    "DecodeLimits",
    "Dialect",
    "Packer",
    "check_structure",
    "packb",
    "unpackb",
]

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


# -- decoding ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeLimits:
    """Bounds on a message's structure, checked by a scan of the raw bytes before anything is built.

    Decoding is C code that holds the GIL: a 40 MB map of 3,000,000 keys froze a whole server for
    seconds although it was under the size cap. Real observations are small trees with arrays as
    ``bin`` blobs (a LIBERO request is ~30 objects, a GR00T batch a few hundred), so the defaults
    leave them a wide margin while capping the worst payload at tens of milliseconds of decoding.
    """

    max_map_keys: int = 1024  # keys in one map
    max_list_items: int = 1024  # items in one list (a client-side batch is one list of observations)
    max_elements: int = 100_000  # objects in the whole message (keys, values, list items, blobs)
    max_depth: int = 32  # nesting of maps and lists
    max_json_bytes: int = 1024 * 1024  # a GR00T modality config sent as a JSON string

    def __post_init__(self) -> None:
        for name in ("max_map_keys", "max_list_items", "max_elements", "max_depth", "max_json_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DecodeLimits.{name}: must be a positive int, got {value!r}")


DEFAULT_LIMITS = DecodeLimits()


class CodecLimitError(CodecError):
    """The payload's structure exceeds a ``DecodeLimits`` bound; refused before it is decoded."""


def _type_table() -> list[tuple[int, int]]:
    """msgpack type byte -> (kind, n): kind 0 = scalar of n bytes in all; 1 = str/bin and 2 = ext with
    an n-byte length field; 3 = map and 4 = array with n children (fix*) or an n-byte count (n < 0)."""
    table = [(0, 1)] * 256  # positive/negative fixint, nil, bool
    for b in range(0x80, 0x90):
        table[b] = (3, b & 0x0F)
    for b in range(0x90, 0xA0):
        table[b] = (4, b & 0x0F)
    for b in range(0xA0, 0xC0):
        table[b] = (0, 1 + (b & 0x1F))
    table[0xC1] = (5, 0)  # never used in msgpack
    fixed = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
    fixed.update({0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17})  # fixext: type byte + data
    for b, n in fixed.items():
        table[b] = (0, 1 + n)
    for b, n in {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}.items():
        table[b] = (1, n)
    for b, n in {0xC7: 1, 0xC8: 2, 0xC9: 4}.items():
        table[b] = (2, n)
    table[0xDC], table[0xDD], table[0xDE], table[0xDF] = (4, -2), (4, -4), (3, -2), (3, -4)
    return table


_TYPES = _type_table()


def check_structure(data: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS) -> int:
    """Walk the raw msgpack bytes (no object is built) and raise ``CodecLimitError`` at the first
    map, list, depth or element count over ``limits``; returns the number of objects.

    The walk stops as soon as a bound is crossed, so its cost is bounded by ``limits`` too.
    A truncated payload ends the walk quietly; the decoder then reports it.
    """
    buf = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
    end, pos, elements = len(buf), 0, 0
    max_elements, max_keys, max_depth = limits.max_elements, limits.max_map_keys, limits.max_depth
    max_items = limits.max_list_items
    pending = [1]  # objects still to read at each open nesting level
    while pos < end:
        while pending and pending[-1] == 0:
            pending.pop()
        if not pending:
            break
        pending[-1] -= 1
        elements += 1
        if elements > max_elements:
            raise CodecLimitError(
                f"payload holds more than max_elements={max_elements} objects "
                "(map keys, values and list items count; send arrays as ndarrays, not lists)"
            )
        kind, n = _TYPES[buf[pos]]
        if kind == 0:
            pos += n
            continue
        if kind in (1, 2):
            pos += 1 + n + int.from_bytes(buf[pos + 1 : pos + 1 + n], "big") + (kind == 2)
            continue
        if kind == 5:
            raise CodecError(f"malformed msgpack payload: invalid type byte 0xc1 at offset {pos}")
        if n >= 0:
            count, pos = n, pos + 1
        else:
            count, pos = int.from_bytes(buf[pos + 1 : pos + 1 - n], "big"), pos + 1 - n
        if kind == 3 and count > max_keys:
            raise CodecLimitError(f"a map at offset {pos} has {count} keys, over max_map_keys={max_keys}")
        if kind == 4 and count > max_items:
            raise CodecLimitError(f"a list at offset {pos} has {count} items, over max_list_items={max_items}")
        if len(pending) > max_depth:
            raise CodecLimitError(f"payload nests maps/lists deeper than max_depth={max_depth}")
        pending.append(2 * count if kind == 3 else count)
    return elements


def _where(path: tuple[Any, ...], message: str) -> str:
    """``message`` prefixed with the field it concerns, e.g. ``['batch'][2]['observation/image']: ...``."""
    if not path:
        return message
    return "".join(f"[{p}]" if isinstance(p, int) else f"[{p!r}]" for p in path) + ": " + message


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


_DTYPES: dict[str | bytes, np.dtype] = {}  # accepted numeric dtype strings, parsed once
_DTYPE_CACHE_MAX = 64


def _parse_dtype(value: Any) -> np.dtype:
    cached = _DTYPES.get(value) if isinstance(value, (str, bytes)) else None
    if cached is not None:  # every request names the same few dtypes: np.dtype() is a third of an array's decode
        return cached
    if not isinstance(value, (str, bytes)):
        raise CodecError(f"array field 'dtype' must be a dtype string like '<f4', got {type(value).__name__}")
    text = _as_text(value, "dtype")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, OverflowError, SyntaxError) as exc:
        raise CodecError(f"unknown dtype {text[:40]!r}") from exc
    _check_dtype(dtype, "decode")
    if dtype.kind in "biuf" and text == dtype.str and len(_DTYPES) < _DTYPE_CACHE_MAX:
        _DTYPES[value] = dtype  # numeric canonical spellings only (~46 str and bytes): strangers cannot fill it
    return dtype


def _parse_shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise CodecError(f"array field 'shape' must be a list of non-negative ints, got {value!r:.80}")
    return tuple(value)


def _array_from_bytes(data: Any, dtype: np.dtype, shape: tuple[int, ...], order: str = "C") -> np.ndarray:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"array field 'data' must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize  # checked before anything is allocated
    if len(data) != expected:
        raise CodecError(
            f"array data has {len(data)} bytes but shape {list(shape)} of dtype {dtype.str!r} needs {expected}"
        )
    if expected == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy()  # type: ignore[call-overload]


def _decode_openpi(obj: Mapping[Any, Any]) -> np.ndarray:
    dtype = _parse_dtype(_get(obj, "dtype"))
    shape = _parse_shape(_get(obj, "shape"))
    return _array_from_bytes(_get(obj, "data"), dtype, shape)


def _decode_npgeneric(obj: Mapping[Any, Any]) -> np.generic:
    dtype = _parse_dtype(_get(obj, "dtype"))
    data = _get(obj, "data")
    if not isinstance(data, (bool, int, float, str, bytes)):  # a list would make an array, not a scalar
        raise CodecError(f"numpy scalar data must be a number, bool or string, got {type(data).__name__}")
    try:
        return dtype.type(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"numpy scalar data {data!r:.40} does not fit dtype {dtype.str!r}") from exc


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
    """A ``.npy`` file, read by hand: its header is checked (dtype allowed, shape matching the bytes)
    before any memory is allocated, where ``np.load`` would trust a header claiming terabytes."""
    blob = _get(obj, "as_npy")
    if not isinstance(blob, (bytes, bytearray)):
        raise CodecError("GR00T array field 'as_npy' must hold .npy bytes")
    if bytes(blob[:6]) != b"\x93NUMPY":  # np.load would otherwise try pickle / return an .npz archive
        raise CodecError("GR00T array field 'as_npy' is not a valid .npy file (missing the \\x93NUMPY magic)")
    stream = io.BytesIO(blob)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise CodecError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
    except CodecError:
        raise
    except Exception as exc:  # numpy's header parser raises ValueError, SyntaxError, TokenError, ...
        raise CodecError(f"GR00T array field 'as_npy' has a bad .npy header: {str(exc)[:200]}") from exc
    _check_dtype(dtype, "decode: GR00T array refused")
    shape = _parse_shape(shape)
    return _array_from_bytes(memoryview(blob)[stream.tell() :], dtype, shape, order="F" if fortran else "C")


def _decode_modality_config(obj: Mapping[Any, Any], limits: DecodeLimits) -> Any:
    payload = _get(obj, "as_json")
    if not isinstance(payload, (str, bytes)):  # N1.5 sends a JSON string, N1.6+ a map
        return payload
    if len(payload) > limits.max_json_bytes:
        raise CodecLimitError(
            f"GR00T modality config JSON has {len(payload)} bytes, over max_json_bytes={limits.max_json_bytes}"
        )
    try:
        return json.loads(payload)
    except RecursionError as exc:
        raise CodecLimitError("GR00T modality config JSON nests too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8
        raise CodecError(f"GR00T modality config is not valid JSON: {str(exc)[:200]}") from exc


def _decode_special(obj: dict[Any, Any], limits: DecodeLimits) -> Any:
    """An array / scalar / modality-config map in any dialect becomes its value; other maps stay."""
    if _has(obj, "__ndarray__"):
        return _decode_openpi(obj)
    if _has(obj, "__npgeneric__"):
        return _decode_npgeneric(obj)
    if _has(obj, "__ndarray_class__"):
        return _decode_npy(obj)
    if _has(obj, "__ModalityConfig_class__"):
        return _decode_modality_config(obj, limits)
    if _has(obj, "nd") and _has(obj, "type") and _has(obj, "data"):
        return _decode_lebedov(obj)
    return obj


def _convert(obj: Any, path: tuple[Any, ...], limits: DecodeLimits) -> Any:
    """Replace array maps bottom-up (children first, as msgpack's object_hook would); an error names
    the field it came from. Recursion depth is bounded by ``limits.max_depth`` (checked first)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (dict, list)):
                obj[key] = _convert(value, (*path, key), limits)
        try:
            return _decode_special(obj, limits)
        except CodecLimitError as exc:
            raise CodecLimitError(_where(path, str(exc))) from exc
        except CodecError as exc:
            raise CodecError(_where(path, str(exc))) from exc
    if isinstance(obj, list):
        for i, value in enumerate(obj):
            if isinstance(value, (dict, list)):
                obj[i] = _convert(value, (*path, i), limits)
    return obj


def unpackb(data: bytes | bytearray | memoryview, *, limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """Decode msgpack bytes from any supported dialect.

    Raises ``CodecLimitError`` for a structure over ``limits`` (found before decoding) and
    ``CodecError`` naming the field and the problem for anything else; no other exception escapes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected a binary msgpack payload, got {type(data).__name__}")
    check_structure(data, limits)
    try:
        tree = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            max_map_len=limits.max_map_keys,
            max_array_len=limits.max_elements,
        )
    except msgpack.ExtraData as exc:
        raise CodecError("malformed msgpack: trailing bytes after the payload") from exc
    except (ValueError, TypeError, msgpack.UnpackException, UnicodeDecodeError, OverflowError) as exc:
        raise CodecError(f"malformed msgpack payload ({type(exc).__name__}: {str(exc)[:200]})") from exc
    try:
        return _convert(tree, (), limits)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError) as exc:  # a gap in the checks
        raise CodecError(f"cannot decode payload ({type(exc).__name__}: {str(exc)[:200]})") from exc
