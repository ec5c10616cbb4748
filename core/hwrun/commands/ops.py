"""`hwrun ops`: which implementation serves each op on a platform, and who refused and why.

Each op is asked with its contract's default spec (the models' shapes), or with the fields
given by ``--shape``, placed on the platform's Target (its device type and architecture here),
so the answer is the one a real call would get on this machine.
"""

from __future__ import annotations

import dataclasses
import json
from fnmatch import fnmatchcase
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from hwrun import knobs
from hwrun.commands import console
from hwrun.errors import UnsupportedError
from hwrun.plugins import PluginSet, load_plugins
from hwrun.registry import OpSpec
from hwrun.target import Target

# --shape keys: the OpSpec fields a user may set (device type and arch come from the Target).
INT_FIELDS = ("num_heads", "head_dim", "block_size", "topk")
SHAPE_KEYS = ("dtype", "formats", *INT_FIELDS)


@click.command()
@click.option("--platform", "platform_name", default=None, help="A platform name, 'all' or 'auto'.")
@click.option("--op", "op_glob", default="*", show_default=True, help="Glob over op names.")
@click.option(
    "--shape",
    "shape",
    multiple=True,
    metavar="KEY=VALUE",
    help=f"Ask for this spec instead of each op's default (repeatable). Keys: "
    f"{', '.join(SHAPE_KEYS)}; formats comma-separated, e.g. --shape formats=bf16 "
    "--shape num_heads=64.",
)
@click.option(
    "--no-fallback",
    is_flag=True,
    help="Do not fall back to the reference; exit 1 when an op is served by no impl.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of tables.")
def ops(
    platform_name: str | None,
    op_glob: str,
    shape: tuple[str, ...],
    no_fallback: bool,
    as_json: bool,
) -> None:
    """Show which implementation serves each op on a platform, and who refused and why."""
    from hwrun.ops import catalogue

    overrides = parse_shape(shape)
    fallback_allowed = knobs.reference_fallback()  # a value it does not accept: exit 2
    contracts = [c for c in catalogue().values() if fnmatchcase(c.name, op_glob)]
    if not contracts:
        raise click.BadParameter(
            f"{op_glob!r} matches no op; ops: {', '.join(sorted(catalogue()))}",
            param_hint="--op",
        )
    plugin_set = load_plugins()
    names = _platforms_for(plugin_set, platform_name)
    allow_fallback = fallback_allowed and not no_fallback
    rows = []
    for name in names:
        target = plugin_set.target(name)
        for contract in contracts:
            spec = target.place(dataclasses.replace(contract.default_spec, **overrides))
            rows.append(_op_row(plugin_set, name, target, spec, allow_fallback))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        for plugin in plugin_set.plugins:
            if plugin.status != "loaded":
                click.echo(f"hwrun: {plugin.name} is {plugin.status}: {plugin.reason}", err=True)
    else:
        _print_tables(plugin_set, names, rows)
    unserved = [f"{r['platform']}:{r['op']}" for r in rows if r["selected"] is None]
    if no_fallback and unserved:
        click.echo(
            f"hwrun: error: --no-fallback: {len(unserved)} op(s) served by no impl: "
            f"{', '.join(unserved)}",
            err=True,
        )
        raise click.exceptions.Exit(1)


def parse_shape(items: tuple[str, ...]) -> dict[str, Any]:
    """``("num_heads=64", "formats=bf16")`` -> OpSpec field overrides; a usage error names the
    bad item and what is accepted."""
    import torch

    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in SHAPE_KEYS or not value:
            raise click.BadParameter(
                f"{item!r} is not KEY=VALUE with KEY one of {', '.join(SHAPE_KEYS)}",
                param_hint="--shape",
            )
        if key in INT_FIELDS:
            if not value.isdigit() or int(value) < 1:
                raise click.BadParameter(
                    f"{key} must be a positive integer, got {value!r}", param_hint="--shape"
                )
            overrides[key] = int(value)
        elif key == "dtype":
            if not isinstance(getattr(torch, value, None), torch.dtype):
                raise click.BadParameter(
                    f"dtype {value!r} is not a torch dtype name (e.g. bfloat16, float8_e4m3fn)",
                    param_hint="--shape",
                )
            overrides[key] = value
        else:
            overrides[key] = tuple(f.strip() for f in value.split(",") if f.strip())
    return overrides


def _platforms_for(plugin_set: PluginSet, requested: str | None) -> list[str]:
    if requested == "all":
        return plugin_set.names()
    return [plugin_set.choose_platform(requested)]


def _op_row(
    plugin_set: PluginSet, platform: str, target: Target, spec: OpSpec, allow_fallback: bool
) -> dict:
    registry = plugin_set.registry(platform)
    row = {
        "op": spec.op,
        "platform": platform,
        "device": target.torch_device(),
        "arch": spec.arch,
        "selected": None,
        "fallback": False,
        "rejected": {},
    }
    try:
        selection = registry.select(spec, allow_fallback=allow_fallback)
    except UnsupportedError as err:
        return {**row, "rejected": err.reasons}
    selected = selection.impl.name
    if selection.fallback:
        selected = f"{selection.impl.platform}:{selected}"
    return {
        **row,
        "selected": selected,
        "fallback": selection.fallback,
        "rejected": selection.rejected,
    }


def _print_tables(plugin_set: PluginSet, names: list[str], rows: list[dict]) -> None:
    out = console()
    for name in names:
        target = plugin_set.target(name)
        table = Table(title=escape(f"ops on {name} ({target.describe()})"))
        for column in ("op", "selected", "fallback", "rejected (impl: reasons)"):
            table.add_column(column)
        for row in (r for r in rows if r["platform"] == name):
            rejected = "\n".join(f"{k}: {'; '.join(v)}" for k, v in row["rejected"].items())
            selected = row["selected"] or "[red]none[/red]"
            fallback = "yes" if row["fallback"] else "no"
            table.add_row(row["op"], selected, fallback, escape(rejected) or "-")
        out.print(table)
        for reason in target.reasons:
            out.print(escape(f"{name} runs on {target.device_type}: {reason}"))
    for plugin in plugin_set.plugins:
        if plugin.status != "loaded":
            reason = escape(plugin.reason or "")
            out.print(f"[red]{escape(plugin.name)} is {plugin.status}[/red]: {reason}")
