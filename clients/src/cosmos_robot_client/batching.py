"""Cutting a client-side batch into requests the server accepts.

A cosmos-robot-server announces, in the metadata frame it sends on connect, its message cap
(``server.max_message_bytes``) and the most observations one ``{"batch": [...]}`` request may hold
(``server.limits.max_client_batch``). A vectorised evaluator with more envs, or bigger images, than
fit in one request gets its batch split here instead of a refusal: the caps exist so that one
client's huge message cannot stall the server's event loop for everybody, and a well-behaved client
should never notice them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = ["MESSAGE_SHARE", "approx_nbytes", "split_batch"]

MESSAGE_SHARE = 0.8  # fill at most this share of the server's max_message_bytes per request
T = TypeVar("T")


def approx_nbytes(value: Any) -> int:
    """Roughly what ``value`` costs on the wire: array bytes plus a little per field."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 64
    if isinstance(value, (bytes, bytearray, str)):
        return len(value) + 8
    if isinstance(value, Mapping):
        return sum(approx_nbytes(k) + approx_nbytes(v) for k, v in value.items()) + 8
    if isinstance(value, (list, tuple)):
        return sum(approx_nbytes(v) for v in value) + 8
    return 16


def split_batch(items: Sequence[T], server: Any) -> list[list[T]]:
    """``items`` in consecutive parts of at most ``max_client_batch`` items and ``MESSAGE_SHARE`` of
    ``max_message_bytes`` each, as announced in ``server`` (the metadata's ``server`` map); one part
    when the server announces neither."""
    items = list(items)
    if not items:
        return []
    server = server if isinstance(server, Mapping) else {}
    limits = server.get("limits") if isinstance(server.get("limits"), Mapping) else {}
    max_items = limits.get("max_client_batch")
    per_part = max_items if isinstance(max_items, int) and max_items > 0 else len(items)
    limit = server.get("max_message_bytes")
    if isinstance(limit, int) and limit > 0:
        per_obs = max(1, max(approx_nbytes(obs) for obs in items))
        per_part = min(per_part, max(1, int(limit * MESSAGE_SHARE) // per_obs))
    return [items[i : i + per_part] for i in range(0, len(items), per_part)]
