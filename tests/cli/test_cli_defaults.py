"""Every command-line option that stands for a config field has that field's default, and every field is
reachable from the command line (or listed here with the reason it is not).

The check walks the commands typer actually builds (so it sees the defaults click will use, however an
option was declared) and compares them with the config classes imported for real. It fails when only
one side is edited: a hand-written default, a new config field without an option, or a changed default
the option does not follow.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer
from typer.main import get_command

from cosmos_robot.cli import app
from cosmos_robot.cli.options import EVAL, RECORD, SERVER, ConfigClass, FieldLink, config_values, real_default

# the config class behind each command's options
COMMAND_CONFIGS: dict[str, ConfigClass] = {"serve": SERVER, "eval": EVAL, "record": RECORD}
# fields deliberately not options, and why
NOT_ON_CLI: dict[tuple[str, str], str] = {
    ("eval", "policy"): "set by --policy or --ckpt",
    ("eval", "policy_args"): "set by -a/--policy-arg",
    ("serve", "warmup_batches"): "--warmup 'auto' depends on --device and --max-batch",
    ("serve", "metadata"): "facts a program adds, not a person",
    ("serve", "ping_interval_s"): "library-only keepalive tuning",
    ("serve", "ping_timeout_s"): "library-only keepalive tuning",
    ("serve", "request_timeout_s"): "library-only; clients have their own timeouts",
    ("serve", "gil_switch_interval_ms"): "library-only latency tuning",
    ("serve", "max_nesting_depth"): "library-only decode bound; every supported client nests < 8 deep",
}


def _fields(cls: type) -> list[str]:
    import dataclasses

    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls.model_fields)


def _links(callback: Any) -> dict[str, FieldLink]:
    """Parameter name -> the config field its option was derived from."""
    links = {}
    for name, param in inspect.signature(callback).parameters.items():
        link = getattr(param.default, "config_field", None)
        if isinstance(link, FieldLink):
            links[name] = link
    return links


def default_mismatches(typer_app: typer.Typer, configs: dict[str, ConfigClass]) -> list[str]:
    """Every disagreement between the built commands' option defaults and the config classes."""
    group: Any = get_command(typer_app)
    problems = []
    for info in typer_app.registered_commands:
        name = info.name or ""
        config = configs.get(name)
        if config is None:
            continue
        cls = config.load()
        links = _links(info.callback)
        click_params = {p.name: p for p in group.commands[name].params}
        covered = set()
        for pname, param in click_params.items():
            link = links.get(str(pname))
            if link is None:
                if pname in _fields(cls) and (name, pname) not in NOT_ON_CLI:
                    problems.append(f"{name} {param.opts[0]}: stands for {cls.__name__}.{pname} but is not derived")
                continue
            covered.add(link.name)
            want = real_default(link.owner.load(), link.name)
            got = link.config_value(param.default)
            if got != want:
                problems.append(
                    f"{name} {param.opts[0]}: default {param.default!r} means {got!r}, "
                    f"but {link.owner.name}.{link.name} defaults to {want!r}"
                )
        for field in _fields(cls):
            if field not in covered and (name, field) not in NOT_ON_CLI:
                problems.append(f"{name}: {cls.__name__}.{field} has no option (add one or list it in NOT_ON_CLI)")
    return problems


def test_every_option_default_is_its_config_fields_default() -> None:
    assert default_mismatches(app, COMMAND_CONFIGS) == []


def test_drift_on_either_side_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-written option default, and a config default the option does not follow, both fail."""
    drifted = typer.Typer()

    @drifted.command("eval")
    def _eval(
        num_envs: int = typer.Option(8),  # hand-written: EvalConfig says 4
        seed: int = EVAL.option("seed"),
    ) -> None: ...

    @drifted.command("other")
    def _other() -> None: ...

    problems = default_mismatches(drifted, {"eval": EVAL})
    assert any("--num-envs" in p and "not derived" in p for p in problems)
    assert any("EvalConfig.episodes_per_task has no option" in p for p in problems)
    assert not any("--seed" in p for p in problems)

    # the config side changes after the option was built: the option keeps the old default
    cls = EVAL.load()
    seed_field = cls.__dataclass_fields__["seed"]
    monkeypatch.setattr(seed_field, "default", 7)
    problems = default_mismatches(drifted, {"eval": EVAL})
    assert any("default 0 means 0, but EvalConfig.seed defaults to 7" in p for p in problems)


@pytest.mark.parametrize("config", [EVAL, RECORD, SERVER], ids=lambda c: c.name)
def test_source_reader_agrees_with_the_imported_class(config: ConfigClass) -> None:
    """Defaults and help are read from the config's source without importing it (fast --help); every
    field the reader returns matches the real class, and every documented field has its comment."""
    cls = config.load()
    for field in _fields(cls):
        try:
            want = real_default(cls, field)
        except ValueError:  # a required field (EvalConfig.policy): nothing to derive
            continue
        assert config.default(field) == want, field
    assert config.doc("num_envs" if config is not SERVER else "max_batch_size")
    if config is SERVER:
        assert "compilation and CUDA graph captures" in config.doc("warmup_batches")  # a comment block above


def test_options_read_the_config_without_importing_it() -> None:
    """``cosmos-robot --help`` must not import MuJoCo (through cosmos_robot_envs) or the server."""
    import subprocess
    import sys

    heavy = ("mujoco", "cosmos_robot_envs", "cosmos_robot_server", "torch")
    code = f"import sys, cosmos_robot.cli; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_config_values_builds_fields_from_the_derived_options() -> None:
    """``serve`` (and ``eval``) build their configs from ``config_values``: each derived option lands on its
    field, converted back (``--max-message-mb`` -> bytes, ``--transport`` -> names), and nothing else does."""
    from cosmos_robot.cli import serve

    options = {name: p.default.default for name, p in inspect.signature(serve.command).parameters.items()}
    options.update(transport="all", max_message_mb=2.0, max_batch=3)
    fields = config_values(serve.command, options)
    assert set(fields) == {link.name for link in _links(serve.command).values()}
    assert fields["transports"] == ("ws", "zmq", "http")
    assert fields["max_message_bytes"] == 2 * 1024 * 1024
    assert fields["max_batch_size"] == 3
    assert SERVER.load()(**fields).max_batch_size == 3
