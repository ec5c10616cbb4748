"""`hwrun platforms`: the discovered platform plugins, their status and devices."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.table import Table

from hwrun.commands import console
from hwrun.plugins import load_plugins


@click.command()
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
