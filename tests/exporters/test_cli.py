"""``cosmos-robot export`` (``cosmos_robot/cli/export.py``): help with examples, a summary, errors."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from cosmos_robot.cli.common import Command
from cosmos_robot.cli.export import command
from cosmos_robot.manifest import verify_manifest
from cosmos_robot.policies.flow import FlowPolicy
from tests.policies._flow_helpers import scrambled_model, tiny_config, tiny_stats

runner = CliRunner()
app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"max_content_width": 120})
app.command("export", cls=Command)(command)
app.command("noop")(lambda: None)  # two commands: invoked as `app export ...`, like the real CLI


def test_help_shows_copy_pasteable_examples() -> None:
    res = runner.invoke(app, ["export", "--help"])
    assert res.exit_code == 0, res.output
    assert "Examples:" in res.output and "--target" in res.output and "--base" in res.output
    examples = [line.strip() for line in res.output.splitlines() if line.strip().startswith("cosmos-robot export ")]
    assert len(examples) == 5 and all(len(e) < 100 for e in examples)  # one line each, never wrapped


def test_export_prints_a_summary_and_refuses_an_existing_out(tmp_path: Path) -> None:
    config = tiny_config()
    src = FlowPolicy(scrambled_model(config), tiny_stats(config)).save_pretrained(tmp_path / "src")
    res = runner.invoke(app, ["export", str(src), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "exported flow (flow)" in res.output and verify_manifest(tmp_path / "out")
    again = runner.invoke(app, ["export", str(src), "-o", str(tmp_path / "out")])
    assert again.exit_code == 2 and "pass --overwrite" in again.output
    bad = runner.invoke(app, ["export", str(tmp_path / "nothing"), "-o", str(tmp_path / "o2")])
    assert bad.exit_code == 2 and "does not exist" in bad.output


def test_export_is_a_cosmos_robot_command() -> None:
    import cosmos_robot.cli as cli

    assert "export" in cli.COMMANDS
    res = runner.invoke(cli.app, ["export", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output
