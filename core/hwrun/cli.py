"""The `hwrun` command group. Exit codes: 0 success, 1 runtime failure, 2 usage error.

Each command is one module (most under :mod:`hwrun.commands`) named in :data:`COMMANDS` and
imported on first use, so `hwrun --help` and `hwrun platforms` stay fast. Adding a command is
one module plus one line here.
"""

from __future__ import annotations

import importlib
import sys

import click

from hwrun import API_VERSION, __version__
from hwrun.errors import HwrunError, UsageError

# name -> "module:attribute" of a click command, imported on first use.
COMMANDS: dict[str, str] = {
    "conformance": "hwrun_conformance.cli:conformance",
    "generate": "hwrun.commands.generate:generate",
    "ops": "hwrun.commands.ops:ops",
    "plan": "hwrun.commands.plan:plan",
    "platforms": "hwrun.commands.platforms:platforms",
    "report": "hwrun.commands.report:report",
    "serve": "hwrun.commands.serve:serve",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module_name, attribute = COMMANDS[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(
    __version__, prog_name="hwrun", message=f"%(prog)s %(version)s (hook API {API_VERSION})"
)
def cli() -> None:
    """hwrun: one runtime contract for hybrid sparse-attention MoE models, many accelerators."""


def main() -> None:
    """Console entry point: UsageError becomes a message and exit code 2, any other
    HwrunError exit code 1."""
    try:
        # Outside standalone mode click returns the code of a command's Exit (ctx.exit(1),
        # --help, --version) instead of raising it, and None when a command just returns.
        code = cli.main(standalone_mode=False)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except UsageError as err:
        click.echo(f"hwrun: error: {err}", err=True)
        sys.exit(2)
    except HwrunError as err:
        click.echo(f"hwrun: error: {err}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
