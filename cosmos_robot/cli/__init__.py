"""The ``cosmos-robot`` command line: one module per command, registered by name in ``COMMANDS``.

Adding a command is one line: write ``cosmos_robot/cli/NAME.py`` with a ``command`` function (its
docstring is the help, with an example) and add ``"NAME"`` to ``COMMANDS``.

Commands import their heavy dependencies inside the function body, and the options derived from
config classes read those classes' sources rather than importing them (``options.py``), so
``cosmos-robot --help`` stays instant and a command never pays for another's imports. Help is click's
plain layout, at most 120 columns wide: it never cuts an option name, whatever the terminal width.
"""

from __future__ import annotations

import importlib

import typer

from cosmos_robot.cli.common import Command
from cosmos_robot.cli.serve import warmup_batches

__all__ = ["COMMANDS", "app", "main", "warmup_batches"]

COMMANDS = ("serve", "probe", "eval", "record", "train", "export", "version")

app = typer.Typer(
    name="cosmos-robot",
    help="Serve, evaluate and post-train robot policies.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)

for _name in COMMANDS:
    app.command(_name, cls=Command)(importlib.import_module(f"cosmos_robot.cli.{_name}").command)


def main() -> None:
    app()
