"""``cosmos-robot eval``: headless parallel evaluation of a server, a factory or a checkpoint folder.

Every option that is an ``EvalConfig`` field takes its default and help from the field
(``cosmos_robot_envs/eval/config.py``); the rest say how to reach the policy.
"""

# ruff: noqa: B008 - typer options are declared as parameter defaults (derived from the config classes)
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from cosmos_robot.cli.common import ALLOW_DOWNLOAD, check_policy_ref, connecting, fail, load_ckpt_policy
from cosmos_robot.cli.options import EVAL, config_values, policy_arg_option, tasks_option

__all__ = ["command"]


def command(
    out: str = typer.Option(..., help="Output folder (episodes.jsonl, results.json, report.html, videos/)."),
    policy: Optional[str] = typer.Option(
        None,
        help="A running server (ws://HOST:PORT) or an in-process policy factory MODULE:FACTORY, "
        "e.g. cosmos_robot_envs.tabletop:ExpertPolicy.",
    ),
    ckpt: Optional[str] = typer.Option(None, help="A checkpoint folder evaluated in-process with batched inference."),
    policy_arg: Optional[list[str]] = policy_arg_option(
        "passed to an in-process factory, or with --ckpt to the family's loader as `serve --ckpt` does, "
        "e.g. -a precision=bf16"
    ),
    suite: str = EVAL.option("suite", help="Env suite: {suites}."),
    tasks: Optional[str] = tasks_option(EVAL),
    episodes_per_task: int = EVAL.option("episodes_per_task"),
    num_envs: int = EVAL.option("num_envs"),
    replan_steps: Optional[int] = EVAL.option(
        "replan_steps",
        help="Actions executed open-loop from each chunk before asking again (default: what the policy "
        f"announces as metadata 'replan_steps', else {EVAL.default('replan_steps')}).",
        from_config=lambda _: None,
        to_config=lambda v: EVAL.default("replan_steps") if v is None else v,
    ),
    seed: int = EVAL.option("seed"),
    video_episodes: int = EVAL.option("video_episodes"),
    video_failures: bool = EVAL.option("video_failures", "--video-failures/--no-video-failures"),
    image_size: int = EVAL.option("image_size"),
    vector_mode: str = EVAL.option("vector_mode"),
    max_steps: Optional[int] = EVAL.option("max_steps"),
    batch_requests: bool = EVAL.option("batch_requests", "--batch-requests/--no-batch-requests"),
    align_starts: bool = EVAL.option("align_starts", "--align-starts/--no-align-starts"),
    infra_retries: int = EVAL.option("infra_retries"),
    step_timeout_s: float = EVAL.option("step_timeout_s"),
    reset_timeout_s: float = EVAL.option("reset_timeout_s"),
    api_key: Optional[str] = typer.Option(None, envvar="COSMOS_ROBOT_API_KEY", help="API key for the server."),
    connect_timeout_s: float = typer.Option(10.0, help="Give up connecting to the server after this long."),
    wait_s: float = typer.Option(
        0.0,
        help="Keep retrying this long while nothing listens at the --policy URL (a server still starting); "
        "0: fail at once.",
    ),
    request_timeout_s: float = typer.Option(300.0, help="Fail when one policy request takes longer."),
    device: str = typer.Option("auto", help="Torch device for --ckpt (auto: cuda when available, else cpu)."),
    allow_download: bool = ALLOW_DOWNLOAD,
    overwrite: bool = typer.Option(False, help="Delete a previous run in --out and start fresh (default: resume it)."),
) -> None:
    """Evaluate a policy on a simulated suite: N envs in lockstep, one batched request per control step.

    Writes per-episode records (episodes.jsonl), per-task success with Wilson 95% intervals
    (results.json), videos and report.html into --out. Rerunning the same command resumes an
    interrupted run; --overwrite starts fresh.

    \b
    Examples:
        cosmos-robot eval --policy ws://127.0.0.1:8000 --tasks reach,push --episodes-per-task 20 --out runs/e1
        cosmos-robot eval --ckpt checkpoints/flow_tabletop --num-envs 8 --out runs/e2
        cosmos-robot eval --ckpt pi05_libero --suite libero_spatial --allow-download --out runs/e3
    """
    options = dict(locals())  # the option values by name (the config's fields are read from them)
    if suite.startswith("text/"):
        _text_eval(ckpt, policy, suite, out, episodes_per_task, seed, device, policy_arg or [])
        return
    if (policy is None) == (ckpt is None):
        raise fail("pass exactly one of --policy (server URL or MODULE:FACTORY) or --ckpt (checkpoint folder)", 2)
    source = policy if policy is not None else f"ckpt:{Path(str(ckpt)).resolve()}"
    remote, policy_kwargs, config = _eval_config(options, source, policy_arg or [])
    if allow_download:  # a loading choice, not a policy argument: not recorded in the results
        if ckpt is None:
            raise fail("--allow-download applies to --ckpt folders (files they name on the hub)", 2)
        policy_kwargs = {**policy_kwargs, "allow_download": True}
    pol = _load(source, remote, ckpt, device, policy_kwargs, api_key, connect_timeout_s, wait_s, request_timeout_s)
    if replan_steps is None:
        config = _announced_replan(config, pol)
    kind = "websocket" if remote else "checkpoint" if ckpt is not None else "in_process"
    results = _run(config, pol, out, kind, overwrite, remote)
    _print_results(results, suite, out)


def _text_eval(
    ckpt: Optional[str],
    policy: Optional[str],
    suite: str,
    out: str,
    episodes: int,
    seed: int,
    device: str,
    policy_arg: list[str],
) -> None:
    """``--suite text/<task>``: exact-answer accuracy of an HF causal-LM folder on held-out prompts (greedy, or
    ``-a temperature=T`` one seeded sample each; ``-a max_new_tokens=N``)."""
    if ckpt is None or policy is not None:
        raise fail(f"--suite {suite} evaluates a model folder in-process: pass --ckpt DIR (an HF causal-LM folder)", 2)
    from cosmos_robot.policy_loading import parse_policy_args
    from cosmos_robot.text.evaluate import run_text_eval

    options = parse_policy_args(policy_arg)
    unknown = sorted(set(options) - {"temperature", "max_new_tokens"})
    if unknown:
        raise fail(f"-a {unknown[0]}: a text eval takes -a temperature=T and -a max_new_tokens=N", 2)
    try:
        results = run_text_eval(
            ckpt,
            suite,
            out,
            episodes_per_task=episodes,
            seed=seed,
            device="cpu" if device == "auto" else device,
            temperature=float(options.get("temperature", 0.0)),
            max_new_tokens=int(options.get("max_new_tokens", 16)),
        )
    except ValueError as exc:  # CheckpointError, an unknown task, a bad conversation
        raise fail(str(exc), 2) from exc
    _print_results(results, suite, out)


def _eval_config(options: dict[str, Any], source: str, policy_arg: list[str]) -> tuple[bool, dict[str, Any], Any]:
    """``(remote, policy kwargs, EvalConfig)`` from the options; a bad one exits with a usage error."""
    from cosmos_robot_envs.eval import EvalConfig, get_suite

    policy = options["policy"]
    try:
        remote = policy is not None and check_policy_ref(policy)
        if remote and policy_arg:
            raise ValueError("--policy-arg applies to an in-process MODULE:FACTORY or --ckpt, not a server URL")
        policy_kwargs: dict[str, Any] = {}
        if not remote:
            from cosmos_robot.policy_loading import parse_policy_args

            policy_kwargs = parse_policy_args(policy_arg)
        fields = config_values(command, options)
        fields["tasks"] = get_suite(fields["suite"]).resolve_tasks(list(fields["tasks"]))
        config = EvalConfig(policy=source, policy_args=policy_kwargs, **fields)
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    return remote, policy_kwargs, config


def _announced_replan(config: Any, pol: Any) -> Any:
    """``config`` executing the policy's announced ``replan_steps`` (metadata) when it names a valid one."""
    import dataclasses

    announced = (pol.metadata or {}).get("replan_steps")
    if announced is None:
        return config
    if isinstance(announced, bool) or not isinstance(announced, int) or announced < 1:
        raise fail(f"the policy announces replan_steps={announced!r}, not an int >= 1: pass --replan-steps N", 2)
    from rich.console import Console

    Console(stderr=True).print(f"replanning every {announced} steps (the policy's metadata 'replan_steps')")
    return dataclasses.replace(config, replan_steps=announced)


def _load(
    source: str,
    remote: bool,
    ckpt: Optional[str],
    device: str,
    policy_kwargs: dict[str, Any],
    api_key: Optional[str],
    connect_timeout_s: float,
    wait_s: float,
    request_timeout_s: float,
) -> Any:
    """The policy: a connected websocket client, a checkpoint loaded in-process, or a factory's product."""
    if remote:
        from cosmos_robot_envs.eval import connect_websocket

        connecting(source)
        try:
            return connect_websocket(
                source,
                api_key=api_key,
                connect_timeout_s=max(connect_timeout_s, wait_s),
                request_timeout_s=request_timeout_s,
                refused_timeout_s=wait_s,
            )
        except (ConnectionError, PermissionError, ValueError) as exc:
            hint = ""
            if isinstance(exc.__cause__, ConnectionRefusedError):
                hint = "\nstart one with `cosmos-robot serve`, or pass --wait-s SECONDS to wait for one starting up"
            raise fail(f"cannot reach the policy server: {exc}{hint}", 1) from exc  # exc names the URL
    if ckpt is not None:
        try:
            return load_ckpt_policy(ckpt, device, policy_kwargs)
        except ValueError as exc:  # a bad folder, -a option or --device (CheckpointError is a ValueError)
            raise fail(str(exc), 2) from exc
    from cosmos_robot.policy_loading import PolicyLoadError, load_policy_factory

    try:
        return load_policy_factory(source, policy_kwargs)
    except PolicyLoadError as exc:
        raise fail(str(exc), 2) from exc


def _run(config: Any, pol: Any, out: str, kind: str, overwrite: bool, remote: bool) -> dict[str, Any]:
    """``run_eval`` with a progress bar; a failure exits with its message; a server connection is closed."""
    from rich.console import Console

    from cosmos_robot_envs.eval import ConfigMismatchError, PolicyOutputError, run_eval
    from cosmos_robot_envs.eval.progress import RichProgress

    try:
        with RichProgress(Console(stderr=True)) as progress:
            results: dict[str, Any] = run_eval(
                config, pol, out, policy_kind=kind, overwrite=overwrite, callbacks=progress
            )
    except KeyboardInterrupt:
        typer.secho(f"interrupted; finished episodes are kept in {out}: rerun the same command to resume", err=True)
        raise typer.Exit(130) from None
    except ConfigMismatchError as exc:
        raise fail(str(exc), 2) from exc
    except PolicyOutputError as exc:
        raise fail(str(exc), 1) from exc
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        raise fail(f"policy {config.policy}: {exc}", 1) from exc
    finally:
        close = getattr(pol, "close", None)
        if remote and callable(close):
            close()
    return results


def _print_results(results: dict[str, Any], suite: str, out: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{suite}: {results['policy']['source']}")
    for column in ("task", "success", "rate", "95% CI"):
        table.add_column(column, justify="left" if column == "task" else "right")
    rows = [*results["tasks"].items(), ("total", results["totals"])]
    for name, s in rows:
        ci = f"[{100 * s['ci95_low']:.0f}%, {100 * s['ci95_high']:.0f}%]"
        table.add_row(name, f"{s['successes']}/{s['episodes']}", f"{100 * s['success_rate']:.1f}%", ci)
    Console().print(table)
    names = sorted({m for _, s in rows for m in s.get("metrics", {})})
    if names:  # the env's own episode numbers (the driving suite's progress, collision, ...): mean and 95% CI
        metrics = Table(title="episode metrics (mean [95% CI])")
        metrics.add_column("task")
        for m in names:
            metrics.add_column(m, justify="right")
        for name, s in rows:
            cells = []
            for m in names:
                entry = s.get("metrics", {}).get(m)
                ci = entry and entry.get("ci95")
                cells.append(
                    "" if entry is None else f"{entry['mean']:.3g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")
                )
            metrics.add_row(name, *cells)
        Console().print(metrics)
    totals = results["totals"]
    if totals.get("infra_failures"):
        reasons = ", ".join(f"{k} x{v}" for k, v in totals.get("infra_reasons", {}).items())
        typer.echo(
            f"{totals['infra_failures']} attempt(s) hit a failed env worker ({reasons}); not counted as the policy's"
        )
    if totals.get("missing"):
        typer.secho(
            f"incomplete: {totals['missing']} episode(s) missing after failed env workers; "
            "rerun the same command to run exactly those",
            err=True,
        )
    thr = results["throughput"]
    typer.echo(f"{thr['episodes_per_min']:.1f} episodes/min; report: {out}/report.html")
