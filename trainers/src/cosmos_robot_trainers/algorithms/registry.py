"""A tiny name -> function registry for advantage estimators, losses and reward providers (STYLE.md item 8).

Recipes name algorithms by string (``advantage = "gae"``, ``loss = "ppo"``, ``reward.provider =
"progress_safety"``); the trainer resolves them
with ``get(kind, name)``. An unknown name raises ``UnknownAlgorithmError`` (a ``ValueError``) that lists
the registered names and suggests the closest one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

KINDS = ("advantage", "loss", "reward")

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}


class UnknownAlgorithmError(ValueError):
    """An unknown kind or name; the message lists the known ones and a did-you-mean suggestion."""


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} Known: {', '.join(sorted(known)) or '(none)'}."


def _check_kind(kind: str) -> None:
    if kind not in _REGISTRY:
        raise UnknownAlgorithmError(f"unknown algorithm kind {kind!r}.{_did_you_mean(kind, list(KINDS))}")


def register(kind: str, name: str) -> Callable[[F], F]:
    """Decorator: register ``fn`` under ``(kind, name)``. Registering a taken name twice is an error."""
    _check_kind(kind)

    def decorator(fn: F) -> F:
        table = _REGISTRY[kind]
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered to {table[name].__qualname__}")
        table[name] = fn
        return fn

    return decorator


def get(kind: str, name: str) -> Callable[..., Any]:
    """The function registered as ``(kind, name)``; ``UnknownAlgorithmError`` with a suggestion otherwise."""
    _check_kind(kind)
    table = _REGISTRY[kind]
    if name not in table:
        raise UnknownAlgorithmError(f"unknown {kind} {name!r}.{_did_you_mean(name, list(table))}")
    return table[name]


def names(kind: str) -> list[str]:
    """Registered names of one kind, sorted."""
    _check_kind(kind)
    return sorted(_REGISTRY[kind])
