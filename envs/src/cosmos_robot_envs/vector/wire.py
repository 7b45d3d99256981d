"""msgpack for the vector layer's own messages (parent <-> its workers, driver <-> its Ray actors).

Why not ``cosmos_robot_client.codec``: that codec speaks openpi's layout, where an array is a map, so
its decoder runs a Python hook on every map of every message. On the per-step path that was about
half of the parent's CPU time for envs with array-valued infos (gym-pusht). Here an array or numpy
scalar is one msgpack *ext* value, so plain maps decode in C and only arrays reach Python. The safety
rules are the codec's: never pickle, refuse object/void/complex dtypes, check every size.

Ext payload: ``[len(dtype)] dtype [ndim] shape(<int64 x ndim) data`` (C order). Code 1 is an array,
code 2 a numpy scalar (a 0-d array unwrapped on decode).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np

__all__ = ["WireError", "pack", "unpack"]

_ARRAY, _SCALAR = 1, 2
_REFUSED_KINDS = "OVc"  # object, void/structured, complex


class WireError(ValueError):
    """A message that cannot be encoded or decoded; the text names the problem."""


def _encode(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)  # tobytes() below writes C order whatever the strides
        if arr.dtype.kind in _REFUSED_KINDS or arr.dtype.hasobject:
            raise WireError(f"dtype {arr.dtype.str!r} cannot be sent; use numeric, bool or fixed-width string arrays")
        dtype = arr.dtype.str.encode()
        header = bytes([len(dtype)]) + dtype + bytes([arr.ndim]) + struct.pack(f"<{arr.ndim}q", *arr.shape)
        return msgpack.ExtType(_SCALAR if isinstance(obj, np.generic) else _ARRAY, header + arr.tobytes())
    raise WireError(f"cannot send a {type(obj).__name__}; only dict, list, str, bytes, numbers, None and numpy")


def _decode(code: int, data: bytes) -> Any:
    if code not in (_ARRAY, _SCALAR):
        raise WireError(f"unknown ext type {code}")
    try:
        n = data[0]
        dtype = np.dtype(data[1 : 1 + n].decode())
        ndim = data[1 + n]
        shape = struct.unpack_from(f"<{ndim}q", data, 2 + n)
    except (IndexError, TypeError, UnicodeDecodeError, struct.error) as exc:
        raise WireError(f"malformed array header ({exc})") from exc
    if dtype.kind in _REFUSED_KINDS or dtype.hasobject:
        raise WireError(f"refused dtype {dtype.str!r}")
    offset = 2 + n + 8 * ndim
    if any(d < 0 for d in shape) or len(data) - offset != math.prod(shape) * dtype.itemsize:
        raise WireError(f"array data of {len(data) - offset} bytes does not fit shape {shape} of {dtype.str!r}")
    arr = np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape).copy()
    return arr[()] if code == _SCALAR else arr


def pack(obj: Any) -> bytes:
    """Encode ``obj``; raises :class:`WireError` naming what cannot be sent."""
    try:
        return msgpack.packb(obj, default=_encode, use_bin_type=True)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode message: {exc}") from exc


def unpack(data: bytes) -> Any:
    """Decode one message written by :func:`pack`."""
    try:
        return msgpack.unpackb(data, ext_hook=_decode, raw=False, strict_map_key=False)
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(f"malformed message ({type(exc).__name__}: {exc})") from exc
