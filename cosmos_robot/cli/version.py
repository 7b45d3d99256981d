"""``cosmos-robot version``: the installed cosmos-robot distributions (a bug report's first lines)."""

from __future__ import annotations

import sys

import typer

__all__ = ["DISTRIBUTIONS", "OPTIONAL", "command"]

# every component of the stack, bottom of the dependency table first; OPTIONAL ones are listed only when installed
DISTRIBUTIONS = (
    "cosmos-robot-client",
    "cosmos-robot-server",
    "cosmos-robot-envs",
    "cosmos-robot",
    "cosmos-robot-trainers",
    "cosmos-robot-exporters",
)
OPTIONAL = frozenset({"cosmos-robot-exporters"})


def command() -> None:
    """Print the versions of the cosmos-robot packages and of Python.

    \b
    Example:
        cosmos-robot version
    """
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in DISTRIBUTIONS:
        try:
            typer.echo(f"{dist} {dist_version(dist)}")
        except PackageNotFoundError:
            if dist not in OPTIONAL:
                typer.echo(f"{dist} (not installed)")
    typer.echo(f"python {sys.version.split()[0]}")
