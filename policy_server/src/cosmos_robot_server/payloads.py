"""Pure, bounded walks over decoded requests and replies: grouping signature, byte cost, NaN check.

Why a module of their own: the batcher, the core and the transports all need them, none of them
touches batching state, and each must stay bounded on hostile input (a 3-million-key map must not be
walked on the event loop), so their budgets live next to the code that spends them.

- ``structure_signature``: keys, shapes and dtypes; requests with equal signatures can be stacked.
  Past ``_SIGNATURE_BUDGET`` nodes it gives up and the request is batched alone.
- ``payload_nbytes``: the memory an observation holds, charged against the admission caps.
- ``nonfinite_problem``: the first NaN/inf in a reply, so a robot is never sent a NaN action.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

__all__ = ["nonfinite_problem", "payload_nbytes", "structure_signature"]

_SIGNATURE_BUDGET = 256  # nodes a structure signature visits; a bigger request is batched alone
_NBYTES_BUDGET = 4096  # nodes payload_nbytes visits; the rest is charged _ENTRY_BYTES each
_ENTRY_BYTES = 64  # rough cost of one Python object in a decoded container
_OUTPUT_CHECK_DEPTH = 4  # nesting of reply maps / lists searched for NaN


def structure_signature(value: Any) -> Hashable:
    """A hashable description of keys, shapes and dtypes; equal signatures can be stacked.

    Bounded: after ``_SIGNATURE_BUDGET`` nodes (or a map with more keys than that) it gives up and
    returns a signature unique to this object, so the request runs alone instead of being walked."""
    budget = [_SIGNATURE_BUDGET]
    sig = _signature(value, 0, budget)
    return sig if budget[0] >= 0 else ("alone", id(value))


def _signature(value: Any, depth: int, budget: list[int]) -> Hashable:
    budget[0] -= 1
    if budget[0] < 0 or depth > 8:
        return "..."
    if isinstance(value, np.ndarray):
        return ("nd", value.shape, value.dtype.str)
    if isinstance(value, dict):
        if len(value) > budget[0]:
            budget[0] = -1
            return "..."
        return tuple(sorted((str(k), _signature(v, depth + 1, budget)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("seq", len(value), tuple(_signature(v, depth + 1, budget) for v in value[:16]))
    return type(value).__name__


def payload_nbytes(value: Any) -> int:
    """Memory an observation holds: array data, strings and bytes, plus ``_ENTRY_BYTES`` per entry.

    Bounded like the signature: past ``_NBYTES_BUDGET`` nodes, entries are charged ``_ENTRY_BYTES``
    each from their container's length, without visiting them."""
    total = 0
    budget = _NBYTES_BUDGET
    stack = [value]
    while stack:
        v = stack.pop()
        budget -= 1
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, (bytes, bytearray, str)):
            total += len(v)
        elif isinstance(v, (dict, list, tuple)):
            total += _ENTRY_BYTES * len(v)
            if budget > len(v):
                stack.extend(v.values() if isinstance(v, dict) else v)
        else:
            total += _ENTRY_BYTES
    return total


def nonfinite_problem(value: Any, path: str = "", depth: int = 0) -> str | None:
    """``"'actions' has 70 non-finite values (NaN/inf)"`` for the first reply value holding NaN/inf."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        arr = np.asarray(value)
        if arr.dtype.kind in "fc":
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            if bad:
                return f"{path or '<reply>'!r} has {bad} non-finite value{'s' if bad > 1 else ''} (NaN/inf)"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path or '<reply>'!r} is {value} (non-finite)"
    if depth >= _OUTPUT_CHECK_DEPTH:
        return None
    if isinstance(value, dict):
        items: Any = ((f"{path}/{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub_path, sub in items:
        problem = nonfinite_problem(sub, sub_path, depth + 1)
        if problem is not None:
            return problem
    return None
