"""`hwrun ops`: which implementation serves each op on a platform, and who refused and why."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from hwrun.commands import console
from hwrun.errors import UnsupportedError
from hwrun.plugins import PluginSet, load_plugins


@click.command()
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
