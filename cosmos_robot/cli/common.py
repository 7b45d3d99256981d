"""What several commands share: error exits, torch devices, checkpoint loading, server URL checks, and
help text that names registries (suites, recipes) without importing them until help is shown."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer
from typer.core import TyperCommand

__all__ = [
    "ALLOW_DOWNLOAD",
    "Command",
    "check_policy_ref",
    "check_server_url",
    "connecting",
    "fail",
    "load_ckpt_policy",
    "torch_device",
]

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_HOST_PORT = re.compile(r"^\[?[\w.:-]+?\]?:\d+$")
_WS_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
POLICY_USAGE = "--policy takes ws://HOST:PORT or MODULE:FACTORY"


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; ``raise fail(...)`` exits with ``code`` (2: usage, 1: runtime)."""
    typer.secho(f"error: {message}", fg="red", err=True)
    return typer.Exit(code)


def torch_device(name: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; anything else is checked by torch."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    return str(dev)


ALLOW_DOWNLOAD = typer.Option(
    False,
    "--allow-download",
    help="Let --ckpt fetch files its folder names from the Hugging Face hub (a pi05 tokenizer, a GR00T "
    "base model) when they are not in the local cache. Off: nothing is downloaded.",
)


def load_ckpt_policy(ckpt: str, device: str, policy_args: dict[str, Any]) -> Any:
    """``serve --ckpt`` and ``eval --ckpt`` alike: the family's loader gets ``device``, the family's
    ``serve_options`` and every ``-a`` option (which win); a bad folder, option or device is a
    ``ValueError`` naming it."""
    from cosmos_robot.policies import load_policy_folder

    return load_policy_folder(ckpt, device=torch_device(device), serving=True, **policy_args)


def _ws_hint(value: str) -> str:
    """``; did you mean ws://HOST:PORT?`` for an http(s):// URL or a bare HOST:PORT, else nothing."""
    if "://" in value:
        parts = urlsplit(value)
        scheme = _WS_SCHEMES.get(parts.scheme)
        if scheme and parts.netloc and scheme != parts.scheme:
            return f"; did you mean {parts._replace(scheme=scheme).geturl()}? (the policy server speaks websocket)"
        return ""
    if _HOST_PORT.match(value):
        return f"; did you mean ws://{value}?"
    return ""


def check_server_url(value: str, usage: str) -> str:
    """``value`` if it is a ``ws://`` / ``wss://`` URL with a host, else a ``ValueError`` that starts with
    ``usage`` and suggests the websocket URL on the same host and port when one is evident."""
    parts = urlsplit(value)
    if parts.scheme in ("ws", "wss") and parts.hostname:
        try:
            _ = parts.port  # raises for a port that is not a number
        except ValueError as exc:
            raise ValueError(f"{usage}; got {value}: {exc}") from exc
        return value
    return _raise(usage, value)


def check_policy_ref(value: str) -> bool:
    """``eval --policy``: True for a server URL, False for an in-process ``MODULE:FACTORY``; anything
    else is a ``ValueError`` saying what the option takes and what was probably meant."""
    if "://" in value:
        check_server_url(value, POLICY_USAGE)
        return True
    if _FACTORY.match(value):  # a HOST:PORT never matches: a factory name does not start with a digit
        return False
    if Path(value).is_dir():
        raise ValueError(f"{POLICY_USAGE}; got the folder {value}: evaluate a checkpoint folder with --ckpt {value}")
    return _raise(POLICY_USAGE, value)


def _raise(usage: str, value: str) -> Any:
    raise ValueError(f"{usage}; got {value}{_ws_hint(value)}")


def connecting(url: str) -> None:
    """Say where we connect before the connection can take time (stderr: stdout stays the result)."""
    typer.echo(f"connecting to {url} ...", err=True)


def _suites() -> str:
    from cosmos_robot_envs.eval.suites import SUITE_NAMES

    return ", ".join(SUITE_NAMES)


def _recipes() -> str:
    from cosmos_robot.config.recipes import RECIPES_DIR

    return ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))) or f"none in {RECIPES_DIR}"


# ``{name}`` in a command's or option's help is replaced by ``HELP_FILLERS[name]()`` when help is shown
HELP_FILLERS: dict[str, Callable[[], str]] = {"suites": _suites, "recipes": _recipes}


def _fill(text: str) -> str:
    for name, make in HELP_FILLERS.items():
        token = "{" + name + "}"
        if token in text:
            text = text.replace(token, make())
    return text


class Command(TyperCommand):
    """A typer command whose help may name registries (``{suites}``, ``{recipes}``): they are looked up
    only when help is printed, so running a command never imports what only its help lists."""

    def format_help(self, ctx: Any, formatter: Any) -> None:  # typer's vendored click Context, HelpFormatter
        if self.help:
            self.help = _fill(self.help)
        for param in self.params:
            text = getattr(param, "help", None)
            if isinstance(text, str):
                param.help = _fill(text)  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)
