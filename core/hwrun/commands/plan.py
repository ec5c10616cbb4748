"""`hwrun plan`: bytes per token, packed block layout and KV capacity of a model, as a table
or JSON (the data itself is :func:`hwrun.kv.plan_report.plan_report`).

Exit codes follow the CLI: a bad option or unknown model is a usage error (2); a configuration
the planner refuses is a PlanError (1) listing every reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from hwrun.kv.capacity import kv_budget
from hwrun.kv.errors import PlanError
from hwrun.kv.layout import DEFAULT_ALIGNMENT, DEFAULT_KERNEL_BLOCK_SIZE
from hwrun.kv.plan_report import plan_report
from hwrun.kv.specs import ModelSpec, index_key_format_names, latent_format_names

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def _parse_size(text: str, binary_tokens: bool) -> int:
    """'51.66e9', '48GiB', '52GB' -> bytes; for token counts ('1M', '128K') units are binary,
    as in "a 1M-token context" (2**20 tokens)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    if not match:
        raise ValueError(text)
    unit = match.group(2) or ""
    if binary_tokens and unit:
        unit = unit.rstrip("i") + "i"
    return int(float(match.group(1)) * _UNITS[unit])


class SizeType(click.ParamType):
    def __init__(self, name: str, binary_tokens: bool, minimum: int = 1):
        self.name = name
        self.binary_tokens = binary_tokens
        self.minimum = minimum

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            size = _parse_size(str(value), self.binary_tokens)
        except ValueError:
            self.fail(f"{value!r} is not a size (examples: 51660000000, 48GiB, 1M)", param, ctx)
        if size < self.minimum:
            self.fail(f"{value!r} must be at least {self.minimum}", param, ctx)
        return size


def _model(name: str) -> ModelSpec:
    from hwrun.models import ConfigError, UnknownModelError, get_model

    try:
        return get_model(name)
    except (UnknownModelError, ConfigError) as err:
        raise click.BadParameter(str(err), param_hint="--model") from None


def _print_table(report: dict[str, Any]) -> None:
    table = Table(title=f"hwrun plan: {report['model']} at TP{report['tp']} DCP{report['dcp']}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    per_token = report["bytes_per_token_per_gpu"]
    layers = report["layers"]
    rows = [
        (
            f"latent B/token/GPU ({layers['latent']} x {report['latent_format']})",
            per_token["latent"],
        ),
        (
            f"index keys B/token/GPU ({layers['index_keys']} x {report['index_format']})",
            per_token["index_keys"],
        ),
        ("total B/token/GPU", per_token["total"]),
        (
            f"KDA state B/request/GPU ({layers['kda']} layers)",
            report["bytes_per_request_per_gpu"]["kda"],
        ),
        (
            f"sliding windows B/request/GPU ({layers['sliding_window']} layers)",
            report["bytes_per_request_per_gpu"]["sliding_window"],
        ),
        ("block size (tokens)", report["block_size"]),
        ("row bytes", report["row_bytes"]),
        ("padding", f"{report['padding_bytes']} B ({report['padding_fraction']:.3%})"),
        ("state rows per request", report["state_rows_per_request"]),
        ("pages per row", len(report["pages"])),
    ]
    for key, label, fmt in (
        ("decode_read_fraction_vs_dense_mla", "decode bytes read vs dense MLA", "{:.1%}"),
        ("kv_budget_per_gpu", "KV budget per GPU (B)", "{:,}"),
        ("num_blocks", "blocks per GPU", "{:,}"),
        ("tokens_per_gpu", "pool tokens per GPU", "{:,}"),
        ("tokens_per_cluster", "pool tokens per replica (TP group)", "{:,}"),
        ("concurrent_requests", f"concurrent requests at {report.get('context')} tokens", "{}"),
        ("context_fills", "contexts the pool holds (state ignored)", "{:.2f}"),
    ):
        if key in report:
            rows.append((label, fmt.format(report[key])))
    for label, value in rows:
        table.add_row(label, f"{value:,}" if isinstance(value, int) else str(value))
    console = Console(soft_wrap=True)
    console.print(table)
    for assumption in report["assumptions"]:
        console.print(f"assumed: {assumption}")
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")


@click.command("plan")
@click.option("--model", "model_name", required=True, help="A known model name or a config.json.")
@click.option("--tp", default=1, show_default=True, type=click.IntRange(min=1), help="TP size.")
@click.option("--dcp", default=1, show_default=True, type=click.IntRange(min=1), help="DCP size.")
@click.option("--latent", type=click.Choice(latent_format_names()), help="Latent cache format.")
@click.option("--index", type=click.Choice(index_key_format_names()), help="Index-key format.")
@click.option(
    "--gpu-mem",
    type=SizeType("BYTES", binary_tokens=False),
    help="GPU memory in bytes (e.g. 288e9, 48GiB); the KV budget per GPU is "
    "gpu-mem x mem-util - weights - overhead (with their defaults: gpu-mem itself).",
)
@click.option("--mem-util", default=1.0, show_default=True, help="Usable share of --gpu-mem.")
@click.option("--weights", default="0", type=SizeType("BYTES", False, 0), help="Weights per GPU.")
@click.option(
    "--overhead", default="0", type=SizeType("BYTES", False, 0), help="Other memory per GPU."
)
@click.option(
    "--context", type=SizeType("N", binary_tokens=True), help="Context length (1M = 2**20)."
)
@click.option("--block-size", type=int, help="Force a block size (a power of two).")
@click.option(
    "--kernel-block-size",
    default=DEFAULT_KERNEL_BLOCK_SIZE,
    show_default=True,
    help="Tokens per page the kernels read.",
)
@click.option("--alignment", default=DEFAULT_ALIGNMENT, show_default=True, help="Page alignment.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plan(
    model_name: str,
    tp: int,
    dcp: int,
    latent: str | None,
    index: str | None,
    gpu_mem: int | None,
    mem_util: float,
    weights: int,
    overhead: int,
    context: int | None,
    block_size: int | None,
    kernel_block_size: int,
    alignment: int,
    as_json: bool,
) -> None:
    """Bytes per token, packed block layout and KV capacity of a model at a TP / DCP size."""
    model = _model(model_name).with_formats(latent=latent, index=index)
    try:
        budget = None if gpu_mem is None else kv_budget(gpu_mem, mem_util, weights, overhead)
        report = plan_report(
            model,
            tp,
            dcp,
            budget,
            context,
            kernel_block_size=kernel_block_size,
            alignment=alignment,
            block_size=block_size,
        )
    except ValueError as err:
        raise PlanError(f"{model.name} at TP{tp} DCP{dcp}", [str(err)]) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_table(report)
