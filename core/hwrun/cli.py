"""The `hwrun` command line. Exit codes: 0 success, 1 runtime failure, 2 usage error.

Subcommands that pull in heavy modules are loaded lazily from :data:`LAZY_COMMANDS`, so
`hwrun --help` and `hwrun platforms` stay fast.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import asdict
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from hwrun import API_VERSION, __version__
from hwrun.errors import HwrunError, UnsupportedError
from hwrun.plugins import PluginSet, load_plugins

# name -> "module:attribute" of a click command, imported on first use.
LAZY_COMMANDS: dict[str, str] = {
    "conformance": "hwrun_conformance.cli:conformance",
    "plan": "hwrun.kv.plan_command:plan",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, attribute = LAZY_COMMANDS[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(
    __version__, prog_name="hwrun", message=f"%(prog)s %(version)s (hook API {API_VERSION})"
)
def cli() -> None:
    """hwrun: one runtime contract for hybrid sparse-attention MoE models, many accelerators."""


def console() -> Console:
    return Console(soft_wrap=True)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def platforms(as_json: bool) -> None:
    """List discovered platform plugins, their status and devices."""
    plugin_set = load_plugins()
    rows = []
    for plugin in plugin_set.plugins:
        devices = plugin_set.devices(plugin.name) if plugin.status == "loaded" else []
        rows.append(
            {
                "name": plugin.name,
                "version": plugin.version,
                "api_version": plugin.api_version,
                "status": plugin.status,
                "reason": plugin.reason,
                "devices": [asdict(d) for d in devices],
                "module": plugin.module,
                "origin": plugin.origin,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="hwrun platforms")
    for column in ("platform", "version", "API", "status", "devices", "module / reason"):
        table.add_column(column)
    for row in rows:
        devices = ", ".join(d["name"] for d in row["devices"]) or "-"
        detail = row["reason"] or row["module"]
        style = {"loaded": "green", "broken": "red", "incompatible": "yellow"}[row["status"]]
        table.add_row(
            row["name"],
            row["version"] or "-",
            row["api_version"] or "-",
            f"[{style}]{row['status']}[/{style}]",
            devices,
            detail,
        )
    console().print(table)


@cli.command()
@click.option("--platform", "platform_name", default=None, help="A platform name, 'all' or 'auto'.")
@click.option("--no-fallback", is_flag=True, help="Do not fall back to the reference.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of tables.")
def ops(platform_name: str | None, no_fallback: bool, as_json: bool) -> None:
    """Show which implementation serves each op on a platform, and who refused and why."""
    from hwrun import knobs
    from hwrun.ops import catalogue

    plugin_set = load_plugins()
    names = _platforms_for(plugin_set, platform_name)
    allow_fallback = knobs.reference_fallback() and not no_fallback
    rows = [
        _op_row(plugin_set, name, contract.default_spec, allow_fallback)
        for name in names
        for contract in catalogue().values()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    out = console()
    if not rows:
        out.print("The op catalogue is empty.")
    for name in names:
        table = Table(title=f"ops on {name}")
        for column in ("op", "selected", "fallback", "rejected (impl: reasons)"):
            table.add_column(column)
        for row in (r for r in rows if r["platform"] == name):
            rejected = "\n".join(f"{k}: {'; '.join(v)}" for k, v in row["rejected"].items())
            selected = row["selected"] or "[red]none[/red]"
            table.add_row(row["op"], selected, "yes" if row["fallback"] else "no", rejected or "-")
        out.print(table)


def _platforms_for(plugin_set: PluginSet, requested: str | None) -> list[str]:
    if requested == "all":
        return plugin_set.names()
    return [plugin_set.choose_platform(requested)]


def _op_row(plugin_set: PluginSet, platform: str, spec: Any, allow_fallback: bool) -> dict:
    registry = plugin_set.registry(platform)
    try:
        selection = registry.select(spec, allow_fallback=allow_fallback)
    except UnsupportedError as err:
        return {
            "op": spec.op,
            "platform": platform,
            "selected": None,
            "fallback": False,
            "rejected": err.reasons,
        }
    selected = selection.impl.name
    if selection.fallback:
        selected = f"{selection.impl.platform}:{selected}"
    return {
        "op": spec.op,
        "platform": platform,
        "selected": selected,
        "fallback": selection.fallback,
        "rejected": selection.rejected,
    }


def main() -> None:
    """Console entry point: HwrunError becomes a message and exit code 1."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except HwrunError as err:
        click.echo(f"hwrun: error: {err}", err=True)
        sys.exit(1)
