"""Build a policy from a ``module:factory`` reference, with errors that say what to fix.

``cosmos-robot serve --policy my_pkg.policies:make_policy --policy-arg chunk_size=10`` imports
``my_pkg.policies``, calls ``make_policy(chunk_size=10)`` and checks that the result implements the
``BasePolicy`` interface, so a typo fails at start-up with a "did you mean", not at the first request.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
from collections.abc import Sequence
from typing import Any

from cosmos_robot_client.base_policy import BasePolicy

__all__ = ["PolicyLoadError", "load_policy_factory", "parse_policy_args"]


class PolicyLoadError(ValueError):
    """The ``--policy`` reference or its arguments are wrong; the message says how."""


def parse_policy_args(items: Sequence[str]) -> dict[str, Any]:
    """``["chunk_size=10", "name=abc", "flag=true"]`` -> ``{"chunk_size": 10, "name": "abc", "flag": True}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise PolicyLoadError(f"--policy-arg {item!r}: expected KEY=VALUE with KEY a Python identifier")
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            out[key] = lowered == "true"
            continue
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def load_policy_factory(ref: str, kwargs: dict[str, Any] | None = None) -> BasePolicy:
    """Import ``module:factory`` and call it with ``kwargs``; the result must be a policy."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyLoadError(
            f"--policy {ref!r}: expected MODULE:FACTORY, e.g. cosmos_robot_server.example_policies:constant"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PolicyLoadError(f"--policy {ref!r}: cannot import module {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        names = [n for n in dir(module) if not n.startswith("_")]
        hint = difflib.get_close_matches(attr, names, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise PolicyLoadError(f"--policy {ref!r}: module {module_name!r} has no attribute {attr!r}{extra}")
    if not callable(factory):
        raise PolicyLoadError(f"--policy {ref!r}: {attr!r} is a {type(factory).__name__}, not a callable factory")
    kwargs = kwargs or {}
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise PolicyLoadError(
            f"--policy {ref!r}: bad --policy-arg for {attr}{inspect.signature(factory)}: {exc}"
        ) from exc
    except ValueError:  # builtins without a signature: let the call decide
        pass
    policy = factory(**kwargs)
    if not callable(getattr(policy, "infer", None)):
        raise PolicyLoadError(
            f"--policy {ref!r}: the factory returned {type(policy).__name__}, which has no infer(obs) method"
        )
    return policy
