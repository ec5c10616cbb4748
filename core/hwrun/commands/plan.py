"""`hwrun plan`: bytes per token, packed block layout and KV capacity of a model, as a table
or JSON (the data itself is :func:`hwrun.kv.plan_report.plan_report`).

Every refusal is a usage error (exit 2) listing every reason at once: a bad option value, an
unknown model or a malformed config.json, options that need each other (``--gpu-mem`` and
``--weights``), a TP size that does not divide the model's heads, and whatever the planner
refuses (DCP not dividing TP, a block size that is not a power of two, a pool without a block):
each comes from the options given, so changing them is the fix.
"""

from __future__ import annotations

import json
import math
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

MAX_SIZE = 2**60  # an exabyte (or 2**60 tokens): anything above is a typo, not hardware
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
    size = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(size) or size > MAX_SIZE:
        raise ValueError(text)
    return int(size)


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
            self.fail(
                f"{value!r} is not a size up to 2**60 (examples: 51660000000, 48GiB, 1M)",
                param,
                ctx,
            )
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
@click.option(
    "--mem-util",
    type=click.FloatRange(0, 1, min_open=True),
    help="Usable share of --gpu-mem (default 1).",
)
@click.option(
    "--weights",
    type=SizeType("BYTES", False, 0),
    help="Weights per GPU (needed with --gpu-mem; 0 plans the KV cache alone).",
)
@click.option(
    "--overhead", type=SizeType("BYTES", False, 0), help="Other memory per GPU (default 0)."
)
@click.option(
    "--context", type=SizeType("N", binary_tokens=True), help="Context length (1M = 2**20)."
)
@click.option(
    "--block-size", type=click.IntRange(min=1), help="Force a block size (a power of two)."
)
@click.option(
    "--kernel-block-size",
    default=DEFAULT_KERNEL_BLOCK_SIZE,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens per page the kernels read.",
)
@click.option(
    "--alignment",
    default=DEFAULT_ALIGNMENT,
    show_default=True,
    type=click.IntRange(min=1),
    help="Page alignment.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plan(
    model_name: str,
    tp: int,
    dcp: int,
    latent: str | None,
    index: str | None,
    gpu_mem: int | None,
    mem_util: float | None,
    weights: int | None,
    overhead: int | None,
    context: int | None,
    block_size: int | None,
    kernel_block_size: int,
    alignment: int,
    as_json: bool,
) -> None:
    """Bytes per token, packed block layout and KV capacity of a model at a TP / DCP size."""
    model = _model(model_name).with_formats(latent=latent, index=index)
    what = f"{model.name} at TP{tp} DCP{dcp}"
    reasons = _option_reasons(model, tp, gpu_mem, mem_util, weights, overhead)
    if reasons:
        raise click.UsageError(str(PlanError(what, reasons)))
    try:
        budget = None
        if gpu_mem is not None:
            budget = kv_budget(gpu_mem, mem_util or 1.0, weights or 0, overhead or 0)
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
    except PlanError as err:
        raise click.UsageError(str(err)) from None
    except ValueError as err:
        raise click.UsageError(str(PlanError(what, [str(err)]))) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_table(report)


def _option_reasons(
    model: ModelSpec,
    tp: int,
    gpu_mem: int | None,
    mem_util: float | None,
    weights: int | None,
    overhead: int | None,
) -> list[str]:
    """Options that need each other, and a TP size the model's heads cannot be split into."""
    reasons = []
    if gpu_mem is not None and weights is None:
        reasons.append(
            "--gpu-mem needs --weights (the model's weight bytes per GPU, e.g. 193.144e9); "
            "pass --weights 0 to size the KV cache as if the GPU held nothing else"
        )
    given = [
        name
        for name, value in (
            ("--weights", weights),
            ("--overhead", overhead),
            ("--mem-util", mem_util),
        )
        if value is not None
    ]
    if gpu_mem is None and given:
        reasons.append(f"{' and '.join(given)} size the KV budget and need --gpu-mem")
    heads = model.attention_heads
    if heads is not None and heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        reasons.append(
            f"--tp {tp} does not divide the model's {heads} attention heads; TP sizes that do: "
            f"{', '.join(map(str, divisors))}"
        )
    return reasons
