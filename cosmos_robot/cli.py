"""The ``cosmos-robot`` command line: one entry point for serving, probing, and (later) eval/train.

Commands import their heavy dependencies inside the function body, so ``cosmos-robot --help``
stays instant and a command never pays for another's imports.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="cosmos-robot",
    help="Serve, evaluate and post-train robot policies.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)

TRANSPORT_CHOICES = {
    "ws": ("ws",),
    "zmq": ("zmq",),
    "http": ("http",),
    "both": ("ws", "zmq"),
    "all": ("ws", "zmq", "http"),
}


def _transports(value: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if part not in TRANSPORT_CHOICES:
            raise typer.BadParameter(f"{part!r}: choose from {', '.join(TRANSPORT_CHOICES)} (comma-separated allowed)")
        names.extend(n for n in TRANSPORT_CHOICES[part] if n not in names)
    return tuple(names)


@app.command()
def serve(
    policy: Annotated[
        Optional[str],
        typer.Option(help="Policy factory as MODULE:FACTORY, e.g. cosmos_robot_server.example_policies:constant."),
    ] = None,
    policy_arg: Annotated[
        Optional[list[str]], typer.Option("--policy-arg", "-a", help="KEY=VALUE passed to the factory (repeatable).")
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 serves other machines.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Websocket port (openpi protocol; also GET /healthz /readyz /metrics).")
    ] = 8000,
    zmq_port: Annotated[int, typer.Option(help="ZMQ port (Isaac-GR00T protocol).")] = 5555,
    http_port: Annotated[int, typer.Option(help="HTTP port (health, metrics, cosmos-framework LIBERO JSON).")] = 8001,
    transport: Annotated[
        str, typer.Option(help="ws, zmq, http, both (ws+zmq) or all; comma-separated list allowed.")
    ] = "ws",
    max_batch: Annotated[int, typer.Option(help="Most observations per batched policy call.")] = 16,
    max_wait_ms: Annotated[
        float, typer.Option(help="Longest a request waits for prompt peers to join its batch.")
    ] = 10.0,
    api_key: Annotated[
        Optional[str],
        typer.Option(envvar="COSMOS_ROBOT_API_KEY", help="Require this key from clients (env COSMOS_ROBOT_API_KEY)."),
    ] = None,
    max_message_mb: Annotated[float, typer.Option(help="Refuse requests larger than this many MiB.")] = 64.0,
    enable_kill: Annotated[bool, typer.Option(help="Allow GR00T clients to stop the server with `kill`.")] = False,
    log_level: Annotated[str, typer.Option(help="Python logging level.")] = "INFO",
) -> None:
    """Serve a policy to openpi, GR00T and cosmos-framework clients.

    Example:

        cosmos-robot serve --policy cosmos_robot_server.example_policies:constant -a action_horizon=10 --transport all
    """
    import logging

    from cosmos_robot.policy_loading import PolicyLoadError, load_policy, parse_policy_args
    from cosmos_robot_server import PolicyServer, ServerConfig

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if policy is None:
        raise typer.BadParameter(
            "pass --policy MODULE:FACTORY (checkpoint folders arrive with --ckpt)", param_hint="--policy"
        )
    try:
        config = ServerConfig(
            host=host,
            port=port,
            zmq_port=zmq_port,
            http_port=http_port,
            transports=_transports(transport),
            max_batch_size=max_batch,
            max_wait_ms=max_wait_ms,
            api_key=api_key,
            max_message_bytes=int(max_message_mb * 1024 * 1024),
            enable_kill=enable_kill,
        )
        pol = load_policy(policy, parse_policy_args(policy_arg or []))
    except (PolicyLoadError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    server = PolicyServer(pol, config)
    schemes = {"ws": "ws", "zmq": "tcp", "http": "http"}

    def announce() -> None:
        urls = ", ".join(f"{name} {schemes[name]}://{host}:{p}" for name, p in server.ports.items())
        typer.echo(f"ready: serving {policy} on {urls} (Ctrl-C to stop)")

    try:
        server.serve_forever(on_ready=announce)
    except OSError as exc:
        typer.secho(f"error: cannot listen: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc


@app.command()
def probe(
    url: Annotated[str, typer.Argument(help="Server to probe, e.g. ws://127.0.0.1:8000.")] = "ws://127.0.0.1:8000",
    requests: Annotated[int, typer.Option("--requests", "-n", help="How many requests to time.")] = 20,
    api_key: Annotated[Optional[str], typer.Option(envvar="COSMOS_ROBOT_API_KEY", help="API key to send.")] = None,
    timeout_s: Annotated[float, typer.Option(help="Connect deadline and per-request timeout.")] = 10.0,
) -> None:
    """Connect to a policy server like a robot would, show its metadata and time a few requests.

    The observation is built from the server's announced input spec (zeros of the right shape and
    dtype), or a LIBERO-sized request when the server announces none.

    Example:

        cosmos-robot probe ws://127.0.0.1:8000 -n 50
    """
    from cosmos_robot.probe import run_probe

    raise typer.Exit(run_probe(url, requests=requests, api_key=api_key, timeout_s=timeout_s))


@app.command()
def version() -> None:
    """Print the versions of the cosmos-robot packages.

    Example:

        cosmos-robot version
    """
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in ("cosmos-robot", "cosmos-robot-client", "cosmos-robot-server"):
        try:
            typer.echo(f"{dist} {dist_version(dist)}")
        except PackageNotFoundError:
            typer.echo(f"{dist} (not installed)")
    typer.echo(f"python {sys.version.split()[0]}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
