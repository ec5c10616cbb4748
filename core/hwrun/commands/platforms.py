"""`hwrun platforms`: the discovered platform plugins, their status, and where each runs here
(its Target: torch device type, devices, and why it has none)."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.markup import escape
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
        target = plugin_set.target(plugin.name) if plugin.status == "loaded" else None
        rows.append(
            {
                "name": plugin.name,
                "version": plugin.version,
                "api_version": plugin.api_version,
                "status": plugin.status,
                "reason": plugin.reason,
                "device_type": target.device_type if target else None,
                "devices": [asdict(d) for d in target.devices] if target else [],
                "device_reasons": list(target.reasons) if target else [],
                "target": target.describe() if target else None,
                "module": plugin.module,
                "origin": plugin.origin,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="hwrun platforms")
    for column in ("platform", "version", "API", "status", "runs on", "module / reason"):
        table.add_column(column)
    for row in rows:
        devices = row["target"] or "-"
        detail = row["reason"] or "\n".join([row["module"], *row["device_reasons"]])
        style = {"loaded": "green", "broken": "red", "incompatible": "yellow"}[row["status"]]
        table.add_row(
            row["name"],
            row["version"] or "-",
            row["api_version"] or "-",
            f"[{style}]{row['status']}[/{style}]",
            escape(devices),
            escape(detail),
        )
    console().print(table)
