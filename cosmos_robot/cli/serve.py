"""``cosmos-robot serve``: one policy (a checkpoint folder or a MODULE:FACTORY) on websocket, ZMQ, HTTP
and optionally AlpaSim's gRPC, with the server's options derived from ``ServerConfig``."""

# ruff: noqa: B008 - typer options are declared as parameter defaults (derived from the config classes)
from __future__ import annotations

from typing import Any, Optional

import typer

from cosmos_robot.cli.common import ALLOW_DOWNLOAD, fail, load_ckpt_policy, torch_device
from cosmos_robot.cli.options import SERVER, config_values, policy_arg_option

__all__ = ["TRANSPORT_CHOICES", "command", "parse_transports", "warmup_batches"]

MIB = 1024 * 1024
TRANSPORT_CHOICES = {
    "ws": ("ws",),
    "zmq": ("zmq",),
    "http": ("http",),
    "both": ("ws", "zmq"),
    "all": ("ws", "zmq", "http"),
}


def _mib_option(field: str, flag: str, help: str) -> Any:
    """A ``ServerConfig`` byte-count field offered on the command line in MiB (the config keeps bytes)."""
    return SERVER.option(field, flag, help=help, from_config=lambda n: n / MIB, to_config=lambda mb: int(mb * MIB))


MAX_MESSAGE_MB_OPTION = _mib_option(
    "max_message_bytes",
    "--max-message-mb",
    "Refuse requests larger than this many MiB, before decoding them.",
)

GROOT_GENERATION_OPTION = SERVER.option(
    "groot_generation",
    help="GR00T clients' generation for get_modality_config (N1.5 decodes a JSON string, N1.6+ a map): "
    "auto (learn it from each peer's requests), n1.5 or n1.6.",
)

COSMOS_ERRORS_OPTION = SERVER.option(
    "cosmos_errors",
    help="cosmos-framework dialect errors as an HTTP status ('http') or, as its own server does, "
    '200 with {"action": [], "error": ...} (\'in_body\') so its client logs the message.',
)

MAX_INFLIGHT_MB_PER_CLIENT_OPTION = _mib_option(
    "max_inflight_bytes_per_client",
    "--max-inflight-mb-per-client",
    "MiB of observations one connection may have in flight; more get 'server busy' (429).",
)

MAX_QUEUED_MB_OPTION = _mib_option(
    "max_queued_bytes",
    "--max-queued-mb",
    "MiB of observations in flight over all clients; more get 'server busy' (503).",
)


def parse_transports(value: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if part not in TRANSPORT_CHOICES:
            raise typer.BadParameter(f"{part!r}: choose from {', '.join(TRANSPORT_CHOICES)} (comma-separated allowed)")
        names.extend(n for n in TRANSPORT_CHOICES[part] if n not in names)
    return tuple(names)


def warmup_batches(value: str, max_batch: int, device: str | None) -> tuple[int, ...]:
    """``serve --warmup``: ``auto`` -> powers of two up to ``max_batch`` (and ``max_batch``) when a
    checkpoint runs on a GPU, else none; ``none``; or a comma-separated list of batch sizes."""
    text = value.strip().lower()
    if text == "auto":
        if device is None or not device.startswith("cuda"):
            return ()
        sizes = {1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch}
        return tuple(sorted(sizes))
    if text in ("none", "0", ""):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise ValueError(f"--warmup {value!r}: expected auto, none or batch sizes such as 1,4,8") from exc


def command(
    ckpt: Optional[str] = typer.Option(
        None, help="Checkpoint folder of any supported family (config.json with its type)."
    ),
    policy: Optional[str] = typer.Option(
        None, help="Policy factory as MODULE:FACTORY, e.g. cosmos_robot_server.example_policies:constant."
    ),
    policy_arg: Optional[list[str]] = policy_arg_option(
        "passed to the factory, or with --ckpt to the family's loader, e.g. -a compile=true -a precision=bf16 for pi05"
    ),
    host: str = SERVER.option("host"),
    port: int = SERVER.option("port"),
    zmq_port: int = SERVER.option("zmq_port"),
    http_port: int = SERVER.option("http_port"),
    transport: str = SERVER.option(
        "transports",
        "--transport",
        help="ws, zmq, http, both (ws+zmq) or all; comma-separated list allowed.",
        from_config=",".join,
        to_config=parse_transports,
    ),
    max_batch: int = SERVER.option("max_batch_size", "--max-batch"),
    max_wait_ms: float = SERVER.option("max_wait_ms"),
    wait_call_fraction: float = SERVER.option("wait_call_fraction"),
    paced_peers: bool = SERVER.option("paced_peers"),
    replicas: int = SERVER.option("replicas"),
    api_key: Optional[str] = SERVER.option(
        "api_key",
        envvar="COSMOS_ROBOT_API_KEY",
        help="Require this key from clients (websocket/HTTP: Authorization: Api-Key, ZMQ: api_token).",
    ),
    max_message_mb: float = MAX_MESSAGE_MB_OPTION,
    enable_kill: bool = SERVER.option("enable_kill"),
    groot_generation: str = GROOT_GENERATION_OPTION,
    cosmos_errors: str = COSMOS_ERRORS_OPTION,
    max_inflight_per_client: int = SERVER.option("max_inflight_per_client"),
    max_inflight_mb_per_client: float = MAX_INFLIGHT_MB_PER_CLIENT_OPTION,
    max_queued_requests: int = SERVER.option("max_queued_requests"),
    max_queued_mb: float = MAX_QUEUED_MB_OPTION,
    max_client_batch: int = SERVER.option("max_client_batch"),
    max_sessions: int = SERVER.option("max_sessions"),
    max_connections: int = SERVER.option("max_connections"),
    max_map_keys: int = SERVER.option("max_map_keys"),
    max_list_items: int = SERVER.option("max_list_items"),
    max_elements: int = SERVER.option("max_elements"),
    header_timeout_s: float = SERVER.option("header_timeout_s"),
    body_timeout_s: float = SERVER.option("body_timeout_s"),
    gc_freeze: bool = SERVER.option("gc_freeze"),
    device: str = typer.Option("auto", help="Torch device for --ckpt (auto: cuda when available, else cpu)."),
    warmup: str = typer.Option(
        "auto",
        help="Batch sizes to run on the policy's example observation before reporting ready, so "
        "compilation and CUDA graph captures happen at start-up: 'auto' (--ckpt on a GPU: 1, 2, 4, ... "
        "up to --max-batch), 'none', or a list such as '1,4,8'.",
    ),
    groot_layout: Optional[str] = typer.Option(
        None,
        help="Also accept GR00T's observations of this embodiment (libero, so100): flat video.*/state.*/"
        "annotation.* keys (answered as action.*) or N1.6's nested {video, state, language} (answered per group).",
    ),
    alpasim_port: Optional[int] = typer.Option(
        None,
        help="Also answer NVIDIA AlpaSim as its gRPC driver (egodriver.EgodriverService) on this port; "
        "it reaches the policy through the websocket transport (docs/alpasim.md).",
    ),
    alpasim_arg: Optional[list[str]] = typer.Option(
        None,
        "--alpasim-arg",
        help="A flag of `python -m cosmos_robot_server.alpasim` for the driver, e.g. --alpasim-arg=--action-dt=0.5 "
        "(repeatable).",
    ),
    allow_download: bool = ALLOW_DOWNLOAD,
    log_level: str = typer.Option("INFO", help="Python logging level."),
) -> None:
    """Serve a policy to openpi, GR00T, cosmos-framework and AlpaSim clients.

    \b
    Examples:
        cosmos-robot serve --ckpt checkpoints/flow_tabletop --transport both
        cosmos-robot serve --policy cosmos_robot_server.example_policies:constant -a action_horizon=10 --transport all
        cosmos-robot serve --ckpt lerobot/pi05_libero_finetuned_local --allow-download
    """
    _run(dict(locals()))  # the option values by name (the config's fields are read from them)


def _run(options: dict[str, Any]) -> None:
    """``serve`` itself: load the policy (a refusal exits 2 naming the problem), then serve until Ctrl-C."""
    import logging

    ckpt, policy, device = options["ckpt"], options["policy"], options["device"]
    logging.basicConfig(level=options["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (policy is None) == (ckpt is None):
        raise typer.BadParameter(
            "pass exactly one of --ckpt DIR or --policy MODULE:FACTORY", param_hint="--ckpt/--policy"
        )
    try:
        config = _server_config(options, ckpt, device, options["warmup"])
        pol = _load_policy(
            ckpt, policy, options["policy_arg"] or [], device, options["groot_layout"], options["allow_download"]
        )
    except ValueError as exc:  # PolicyLoadError and CheckpointError are ValueErrors too
        raise fail(str(exc), 2) from exc
    driver = _alpasim_sidecar(config, options["alpasim_port"], options["alpasim_arg"] or [], options["api_key"])
    _serve(pol, config, driver, label=str(ckpt or policy))


def _server_config(options: dict[str, Any], ckpt: Optional[str], device: str, warmup: str) -> Any:
    """The ``ServerConfig`` of the options derived from its fields, plus the warm-up batches."""
    from cosmos_robot_server import ServerConfig

    resolved_device = torch_device(device) if ckpt is not None else None
    fields = config_values(command, options)
    batches = warmup_batches(warmup, fields["max_batch_size"], resolved_device)
    return ServerConfig(**fields, warmup_batches=batches)


def _load_policy(
    ckpt: Optional[str],
    policy: Optional[str],
    policy_arg: list[str],
    device: str,
    groot_layout: Optional[str],
    allow_download: bool = False,
) -> Any:
    """The checkpoint folder or the factory's policy, with GR00T's flat layout accepted when asked."""
    from cosmos_robot.policy_loading import load_policy_factory, parse_policy_args

    kwargs = parse_policy_args(policy_arg)
    if allow_download:
        if ckpt is None:
            raise ValueError("--allow-download applies to --ckpt folders (files they name on the hub)")
        kwargs["allow_download"] = True
    pol = load_ckpt_policy(str(ckpt), device, kwargs) if ckpt is not None else load_policy_factory(str(policy), kwargs)
    if groot_layout is not None:
        from cosmos_robot.policies.groot_layout import LAYOUTS, Gr00tLayoutPolicy

        if groot_layout not in LAYOUTS:
            raise ValueError(f"--groot-layout {groot_layout!r} is not one of {sorted(LAYOUTS)}")
        pol = Gr00tLayoutPolicy(pol, LAYOUTS[groot_layout])
    return pol


def _serve(pol: Any, config: Any, driver: _AlpasimSidecar | None, label: str) -> None:
    """Serve until Ctrl-C; ``ready:`` names every URL (the AlpaSim driver's too) once the warm-up is done."""
    from cosmos_robot_server import PolicyServer

    server = PolicyServer(pol, config)
    schemes = {"ws": "ws", "zmq": "tcp", "http": "http"}

    def announce() -> None:
        urls = ", ".join(f"{name} {schemes[name]}://{config.host}:{p}" for name, p in server.ports.items())
        if driver is not None:
            driver.start(server.ports["ws"])
            urls += f", alpasim grpc://{config.host}:{driver.port}"
        typer.echo(f"ready: serving {label} on {urls} (Ctrl-C to stop)")

    try:
        server.serve_forever(on_ready=announce)
    except OSError as exc:
        raise fail(f"cannot listen: {exc}", 1) from exc
    except (RuntimeError, ValueError) as exc:  # a failed warm-up: the policy would fail its first clients
        raise fail(str(exc), 1) from exc
    finally:
        if driver is not None:
            driver.stop()


class _AlpasimSidecar:
    """The AlpaSim driver beside the policy server: each rollout talks to the policy through our own
    websocket transport on loopback, so its requests are validated and batched with everyone else's
    and the model is only ever called from the server's batching thread."""

    def __init__(self, config: Any, port: int, args: list[str], api_key: str | None, host: str) -> None:
        from cosmos_robot_server.alpasim.launcher import build_parser, config_from_args

        ns = build_parser().parse_args(["--policy", "straight", "--host", host, "--port", str(port), *args])
        self.driver_config = config_from_args(ns)
        self.host, self.requested, self.api_key = host, port, api_key
        self.request_timeout: float = ns.request_timeout
        self.server: Any = None
        self.port = port

    def start(self, ws_port: int) -> None:
        from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
        from cosmos_robot_server.alpasim import AlpasimDriverServer

        url, key, timeout = f"ws://127.0.0.1:{ws_port}", self.api_key, self.request_timeout

        def connect() -> Any:
            return WebsocketClientPolicy(url, api_key=key, request_timeout_s=timeout)

        self.server = AlpasimDriverServer(connect, self.host, self.requested, config=self.driver_config)
        self.port = self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def _alpasim_sidecar(config: Any, port: int | None, args: list[str], api_key: str | None) -> _AlpasimSidecar | None:
    """The AlpaSim driver of ``--alpasim-port`` (None without it); a refusal exits naming the option."""
    if port is None:
        return None
    try:
        return _alpasim_driver(config, port, args, api_key)
    except (ImportError, ValueError) as exc:
        raise fail(f"--alpasim-port: {exc}", 2) from exc


def _alpasim_driver(config: Any, port: int, args: list[str], api_key: str | None) -> _AlpasimSidecar:
    if "ws" not in config.transports:
        raise ValueError("the AlpaSim driver reaches the policy over the websocket transport; add ws to --transport")
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        raise ImportError('needs the AlpaSim extra: pip install "cosmos-robot-server[alpasim]"') from exc
    try:
        return _AlpasimSidecar(config, port, args, api_key, config.host)
    except SystemExit as exc:  # argparse's way of refusing a flag
        raise ValueError(f"--alpasim-arg {' '.join(args)!r} is not valid") from exc
