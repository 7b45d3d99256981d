"""The ``cosmos-robot`` command line: one entry point for serving, probing, and (later) eval/train.

Commands import their heavy dependencies inside the function body, so ``cosmos-robot --help``
stays instant and a command never pays for another's imports.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

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


def _torch_device(name: str) -> str:
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


@app.command()
def serve(
    ckpt: Annotated[
        Optional[str], typer.Option(help="Checkpoint folder of any supported family (config.json with its type).")
    ] = None,
    policy: Annotated[
        Optional[str],
        typer.Option(help="Policy factory as MODULE:FACTORY, e.g. cosmos_robot_server.example_policies:constant."),
    ] = None,
    policy_arg: Annotated[
        Optional[list[str]],
        typer.Option(
            "--policy-arg",
            "-a",
            help="KEY=VALUE passed to the factory, or with --ckpt to the family's loader, e.g. -a compile=true "
            "-a precision=bf16 for pi05 (repeatable).",
        ),
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
    device: Annotated[
        str, typer.Option(help="Torch device for --ckpt (auto: cuda when available, else cpu).")
    ] = "auto",
    warmup: Annotated[
        str,
        typer.Option(
            help="Batch sizes to run on the policy's example observation before reporting ready, so "
            "compilation and CUDA graph captures happen at start-up: 'auto' (--ckpt on a GPU: 1, 2, 4, ... "
            "up to --max-batch), 'none', or a list such as '1,4,8'."
        ),
    ] = "auto",
    groot_layout: Annotated[
        Optional[str],
        typer.Option(
            help="Also accept GR00T's flat video.*/state.*/annotation.* observations of this embodiment "
            "(libero), batch axis on the wire, answered as action.* keys."
        ),  # fmt: skip
    ] = None,
    alpasim_port: Annotated[
        Optional[int],
        typer.Option(
            help="Also answer NVIDIA AlpaSim as its gRPC driver (egodriver.EgodriverService) on this port; "
            "it reaches the policy through the websocket transport (docs/alpasim.md)."
        ),  # fmt: skip
    ] = None,
    alpasim_arg: Annotated[
        Optional[list[str]],
        typer.Option(
            "--alpasim-arg",
            help="A flag of `python -m cosmos_robot_server.alpasim` for the driver, e.g. --alpasim-arg=--action-dt=0.5 "
            "(repeatable).",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Python logging level.")] = "INFO",
) -> None:
    """Serve a policy to openpi, GR00T, cosmos-framework and AlpaSim clients.

    Example:

        cosmos-robot serve --ckpt checkpoints/flow_tabletop --transport both

        cosmos-robot serve --policy cosmos_robot_server.example_policies:constant -a action_horizon=10 --transport all
    """
    import logging

    from cosmos_robot.policy_loading import PolicyLoadError, load_policy, parse_policy_args
    from cosmos_robot_server import PolicyServer, ServerConfig

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (policy is None) == (ckpt is None):
        raise typer.BadParameter(
            "pass exactly one of --ckpt DIR or --policy MODULE:FACTORY", param_hint="--ckpt/--policy"
        )
    try:
        resolved_device = _torch_device(device) if ckpt is not None else None
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
            warmup_batches=warmup_batches(warmup, max_batch, resolved_device),
        )
        if ckpt is not None:
            from cosmos_robot.policies import load_policy as load_checkpoint

            pol = load_checkpoint(ckpt, device=resolved_device, **parse_policy_args(policy_arg or []))
        else:
            pol = load_policy(str(policy), parse_policy_args(policy_arg or []))
        if groot_layout is not None:
            from cosmos_robot.policies.groot_layout import LAYOUTS, Gr00tLayoutPolicy

            if groot_layout not in LAYOUTS:
                raise ValueError(f"--groot-layout {groot_layout!r} is not one of {sorted(LAYOUTS)}")
            pol = Gr00tLayoutPolicy(pol, LAYOUTS[groot_layout])
    except (PolicyLoadError, ValueError) as exc:  # CheckpointError is a ValueError too
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    driver = None
    if alpasim_port is not None:
        try:
            driver = _alpasim_driver(config, alpasim_port, alpasim_arg or [], api_key)
        except (ImportError, ValueError) as exc:
            typer.secho(f"error: --alpasim-port: {exc}", fg="red", err=True)
            raise typer.Exit(2) from exc
    server = PolicyServer(pol, config)
    schemes = {"ws": "ws", "zmq": "tcp", "http": "http"}

    def announce() -> None:
        urls = ", ".join(f"{name} {schemes[name]}://{host}:{p}" for name, p in server.ports.items())
        if driver is not None:
            driver.start(server.ports["ws"])
            urls += f", alpasim grpc://{host}:{driver.port}"
        typer.echo(f"ready: serving {ckpt or policy} on {urls} (Ctrl-C to stop)")

    try:
        server.serve_forever(on_ready=announce)
    except OSError as exc:
        typer.secho(f"error: cannot listen: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    except (RuntimeError, ValueError) as exc:  # a failed warm-up: the policy would fail its first clients
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
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
def eval(
    out: Annotated[str, typer.Option(help="Output folder (episodes.jsonl, results.json, report.html, videos/).")],
    policy: Annotated[
        Optional[str],
        typer.Option(
            help="A running server (ws://HOST:PORT) or an in-process policy factory MODULE:FACTORY, "
            "e.g. cosmos_robot_envs.tabletop:ExpertPolicy."
        ),
    ] = None,
    ckpt: Annotated[
        Optional[str], typer.Option(help="A checkpoint folder evaluated in-process with batched inference.")
    ] = None,
    policy_arg: Annotated[
        Optional[list[str]],
        typer.Option("--policy-arg", "-a", help="KEY=VALUE passed to an in-process factory (repeatable)."),
    ] = None,
    suite: Annotated[str, typer.Option(help="Env suite.")] = "tabletop",
    tasks: Annotated[
        Optional[str], typer.Option(help="Comma-separated task names of the suite (default: all of them).")
    ] = None,
    episodes_per_task: Annotated[int, typer.Option(help="Episodes per task.")] = 10,
    num_envs: Annotated[int, typer.Option(help="Envs stepped in lockstep; one batched request per step.")] = 4,
    replan_steps: Annotated[int, typer.Option(help="Actions executed open-loop from each chunk.")] = 5,
    seed: Annotated[int, typer.Option(help="Base seed; each episode's seed derives from it, its task and index.")] = 0,
    video_episodes: Annotated[int, typer.Option(help="Record MP4s of the first M episodes of each task.")] = 1,
    image_size: Annotated[int, typer.Option(help="Camera image side in pixels.")] = 128,
    vector_mode: Annotated[
        str, typer.Option(help="sync (in-process) or async (a worker process per env, survives env crashes).")
    ] = "async",
    max_steps: Annotated[
        Optional[int], typer.Option(help="Override every task's episode horizon (control steps).")
    ] = None,
    api_key: Annotated[
        Optional[str], typer.Option(envvar="COSMOS_ROBOT_API_KEY", help="API key for the server.")
    ] = None,
    connect_timeout_s: Annotated[float, typer.Option(help="Give up connecting to the server after this long.")] = 10.0,
    request_timeout_s: Annotated[float, typer.Option(help="Fail when one policy request takes longer.")] = 300.0,
    device: Annotated[
        str, typer.Option(help="Torch device for --ckpt (auto: cuda when available, else cpu).")
    ] = "auto",
    overwrite: Annotated[
        bool, typer.Option(help="Delete a previous run in --out and start fresh (default: resume it).")
    ] = False,
) -> None:
    """Evaluate a policy on a simulated suite: N envs in lockstep, one batched request per control step.

    Writes per-episode records (episodes.jsonl), per-task success with Wilson 95% intervals
    (results.json), videos and report.html into --out. Rerunning the same command resumes an
    interrupted run; --overwrite starts fresh.

    Example:

        cosmos-robot eval --policy ws://127.0.0.1:8000 --tasks reach,push --episodes-per-task 20 --out runs/e1

        cosmos-robot eval --ckpt checkpoints/flow_tabletop --num-envs 8 --out runs/e2
    """
    from rich.console import Console
    from rich.table import Table

    from cosmos_robot_client.base_policy import BasePolicy
    from cosmos_robot_envs.eval import (
        ConfigMismatchError,
        EvalConfig,
        PolicyOutputError,
        connect_websocket,
        get_suite,
        is_websocket_url,
        run_eval,
    )
    from cosmos_robot_envs.eval.progress import RichProgress

    def fail(message: str, code: int) -> typer.Exit:
        typer.secho(f"error: {message}", fg="red", err=True)
        return typer.Exit(code)

    if (policy is None) == (ckpt is None):
        raise fail("pass exactly one of --policy (server URL or MODULE:FACTORY) or --ckpt (checkpoint folder)", 2)
    source = policy if policy is not None else f"ckpt:{Path(str(ckpt)).resolve()}"
    remote = policy is not None and is_websocket_url(policy)
    try:
        if ckpt is not None and policy_arg:
            raise ValueError("--policy-arg only applies to an in-process MODULE:FACTORY policy, not --ckpt")
        if remote and policy_arg:
            raise ValueError("--policy-arg only applies to an in-process MODULE:FACTORY policy, not a server URL")
        task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else []
        resolved = get_suite(suite).resolve_tasks(task_list)
        policy_kwargs: dict[str, object] = {}
        if policy is not None and not remote:
            from cosmos_robot.policy_loading import parse_policy_args

            policy_kwargs = parse_policy_args(policy_arg or [])
        config = EvalConfig(
            policy=source,
            policy_args=policy_kwargs,
            suite=suite,
            tasks=resolved,
            episodes_per_task=episodes_per_task,
            num_envs=num_envs,
            replan_steps=replan_steps,
            seed=seed,
            image_size=image_size,
            vector_mode=vector_mode,
            video_episodes=video_episodes,
            max_steps=max_steps,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc

    pol: BasePolicy
    if remote:
        try:
            pol = connect_websocket(
                source, api_key=api_key, connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s
            )
        except (ConnectionError, PermissionError, ValueError) as exc:
            raise fail(f"cannot reach the policy server: {exc}", 1) from exc  # exc names the URL
    elif ckpt is not None:
        from cosmos_robot.policies import CheckpointError
        from cosmos_robot.policies import load_policy as load_checkpoint

        try:
            pol = load_checkpoint(ckpt, device=_torch_device(device))
        except (CheckpointError, ValueError) as exc:  # a bad folder or a bad --device
            raise fail(str(exc), 2) from exc
    else:
        from cosmos_robot.policy_loading import PolicyLoadError, load_policy

        try:
            pol = load_policy(source, policy_kwargs)
        except PolicyLoadError as exc:
            raise fail(str(exc), 2) from exc

    console = Console(stderr=True)
    try:
        with RichProgress(console) as progress:
            results = run_eval(
                config,
                pol,
                out,
                policy_kind="websocket" if remote else "checkpoint" if ckpt is not None else "in_process",
                overwrite=overwrite,
                callbacks=progress,
            )
    except KeyboardInterrupt:
        typer.secho(f"interrupted; finished episodes are kept in {out}: rerun the same command to resume", err=True)
        raise typer.Exit(130) from None
    except ConfigMismatchError as exc:
        raise fail(str(exc), 2) from exc
    except PolicyOutputError as exc:
        raise fail(str(exc), 1) from exc
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        raise fail(f"policy {source}: {exc}", 1) from exc
    finally:
        close = getattr(pol, "close", None)
        if remote and callable(close):
            close()

    table = Table(title=f"{suite}: {results['policy']['source']}")
    for column in ("task", "success", "rate", "95% CI"):
        table.add_column(column, justify="left" if column == "task" else "right")
    rows = [*results["tasks"].items(), ("total", results["totals"])]
    for name, s in rows:
        ci = f"[{100 * s['ci95_low']:.0f}%, {100 * s['ci95_high']:.0f}%]"
        table.add_row(name, f"{s['successes']}/{s['episodes']}", f"{100 * s['success_rate']:.1f}%", ci)
    Console().print(table)
    thr = results["throughput"]
    typer.echo(f"{thr['episodes_per_min']:.1f} episodes/min; report: {out}/report.html")


@app.command()
def record(
    out: Annotated[str, typer.Option(help="Dataset folder to create (a LeRobot v3 dataset).")],
    suite: Annotated[str, typer.Option(help="Env suite.")] = "tabletop",
    tasks: Annotated[
        Optional[str], typer.Option(help="Comma-separated task names of the suite (default: all of them).")
    ] = None,
    episodes_per_task: Annotated[int, typer.Option(help="Expert rollouts per task.")] = 50,
    num_envs: Annotated[int, typer.Option(help="Envs stepped in parallel.")] = 4,
    image_size: Annotated[int, typer.Option(help="Camera image side in pixels.")] = 128,
    seed: Annotated[
        int, typer.Option(help="Base seed; episode seeds hash it with the task and index (disjoint from eval's).")
    ] = 0,
    only_success: Annotated[
        bool, typer.Option("--only-success/--keep-failed", help="Keep only episodes the expert solved.")
    ] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing dataset in --out.")] = False,
    vector_mode: Annotated[str, typer.Option(help="async (a worker process per env) or sync (in-process).")] = "async",
    videos: Annotated[
        bool, typer.Option(help="Store cameras as MP4 (LeRobot's encoder, lossy) instead of PNG frames.")
    ] = False,
    max_steps: Annotated[
        Optional[int], typer.Option(help="Override every task's episode horizon (control steps).")
    ] = None,
    repo_id: Annotated[str, typer.Option(help="LeRobot dataset id (a name only, nothing is uploaded).")] = (
        "local/cosmos_robot_tabletop"
    ),
) -> None:
    """Record scripted-expert demonstrations as a LeRobot dataset (cameras, state, actions, instruction).

    Episodes stop at success; failed rollouts are dropped unless --keep-failed. The seeds, the
    command and any dropped episodes are listed in DIR/meta/cosmos_robot.json. Read it back with
    LeRobotDataset(repo_id, root=DIR) or cosmos_robot.data.load_demonstrations.

    Example:

        cosmos-robot record --tasks reach,push,pick_place,open_drawer --episodes-per-task 50 --out data/tabletop
    """
    from rich.console import Console

    from cosmos_robot.data.progress import RichRecordProgress
    from cosmos_robot.data.record import RecordConfig, record_demonstrations

    def fail(message: str, code: int) -> typer.Exit:
        typer.secho(f"error: {message}", fg="red", err=True)
        return typer.Exit(code)

    try:
        config = RecordConfig(
            tasks=tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else (),
            episodes_per_task=episodes_per_task,
            suite=suite,
            num_envs=num_envs,
            image_size=image_size,
            seed=seed,
            only_success=only_success,
            vector_mode=vector_mode,
            use_videos=videos,
            max_steps=max_steps,
            repo_id=repo_id,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    console = Console(stderr=True)
    try:
        with RichRecordProgress(console) as progress:
            summary = record_demonstrations(
                config, out, overwrite=overwrite, callbacks=progress, command=["cosmos-robot", *sys.argv[1:]]
            )
    except KeyboardInterrupt:
        typer.secho(f"interrupted; the episodes written so far form a valid dataset in {out}", err=True)
        raise typer.Exit(130) from None
    except (FileExistsError, ValueError) as exc:
        raise fail(str(exc), 2) from exc
    except RuntimeError as exc:
        raise fail(str(exc), 1) from exc
    counts, thr = summary["counts"], summary["throughput"]
    typer.echo(
        f"kept {counts['kept']}/{counts['rolled_out']} episodes ({counts['frames']} frames), "
        f"{counts['failed']} failed; {thr['episodes_per_min']:.1f} episodes/min; dataset: {out}"
    )


@app.command()
def train(
    recipe: Annotated[
        str, typer.Argument(help="Recipe name in recipes/ (e.g. sft_flow_tabletop, debug) or a .toml path.")
    ],
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", help="Override a recipe field: KEY=VALUE with a dotted key (repeatable)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the newest checkpoint in the output folder (--no-resume refuses to).")
    ] = True,
    overwrite: Annotated[
        bool, typer.Option(help="Delete a previous run in the output folder and start fresh.")
    ] = False,
) -> None:
    """Train a policy from a recipe: SFT (records the demonstrations if missing) or online RL
    (joint_ppo, grpo, nft, dpo recipes) in simulation; checkpoints, resumes.

    Writes config.resolved.json, metrics.jsonl, TensorBoard events, checkpoints/step_XXXXXX/,
    learning_curve.png and final/ (a policy folder for `cosmos-robot serve --ckpt` / `eval --ckpt`)
    into the recipe's output.dir. Rerunning the same command after an interruption continues from
    the newest checkpoint with the same curve; a recipe that differs in a training field is refused.

    Example:

        cosmos-robot train sft_flow_tabletop --set train.steps=2000 --set output.dir=runs/sft_short

        cosmos-robot train joint_ppo_flow_tabletop --set train.device=cuda --set env.num_envs=16
    """
    from cosmos_robot.config import ConfigError
    from cosmos_robot.policies.registry import CheckpointError

    try:
        from cosmos_robot_trainers.launch import launch
        from cosmos_robot_trainers.rl.trainer import RatioGateError
        from cosmos_robot_trainers.sft.rundir import RunDirError
    except ImportError as exc:
        typer.secho(f"error: training needs cosmos-robot-trainers (pip install -e trainers): {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    try:
        result = launch(
            recipe, list(set_ or []), resume=resume, overwrite=overwrite, log=lambda m: typer.echo(m, err=True)
        )
    except (ConfigError, RunDirError, CheckpointError, FileNotFoundError, FileExistsError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    except (RatioGateError, FloatingPointError) as exc:  # the RL ratio gate, a diverged loss
        typer.secho(
            f"error: {exc}\nthe newest checkpoint is kept; fix the cause and rerun to resume", fg="red", err=True
        )
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        typer.secho("interrupted; rerun the same command to resume from the newest checkpoint", err=True)
        raise typer.Exit(130) from None
    final = f"; policy: {result.final_dir}" if result.final_dir else ""
    typer.echo(f"step {result.step}: {result.out_dir}{final}")


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
