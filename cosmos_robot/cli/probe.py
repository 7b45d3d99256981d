"""``cosmos-robot probe``: connect to a policy server like a robot would, show its metadata, time requests."""

from __future__ import annotations

from typing import Optional

import typer

from cosmos_robot.cli.common import check_server_url, fail

__all__ = ["command"]


def command(
    url: str = typer.Argument("ws://127.0.0.1:8000", metavar="URL", help="Server to probe, e.g. ws://127.0.0.1:8000."),
    requests: int = typer.Option(20, "--requests", "-n", help="How many requests to time."),
    api_key: Optional[str] = typer.Option(None, envvar="COSMOS_ROBOT_API_KEY", help="API key to send."),
    timeout_s: float = typer.Option(10.0, help="Connect deadline and per-request timeout."),
    wait_s: float = typer.Option(
        0.0, help="Keep retrying this long while nothing listens at URL (a server still starting); 0: fail at once."
    ),
) -> None:
    """Connect to a policy server like a robot would, show its metadata and time a few requests.

    The observation is the one the server warms up with (one key per input, gray 224x224 images,
    zero state), rebuilt from the server's announced input spec, or a LIBERO-sized request when
    the server announces none.

    \b
    Example:
        cosmos-robot probe ws://127.0.0.1:8000 -n 50
    """
    from cosmos_robot.probe import run_probe

    try:
        url = check_server_url(url, "probe takes a server URL ws://HOST:PORT")
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    raise typer.Exit(run_probe(url, requests=requests, api_key=api_key, timeout_s=timeout_s, wait_s=wait_s))
