"""`hwrun report`: the platform capability report (report.html, report.md, report.json), or with
``--merge`` the support matrix of several machines' conformance results.

The report asks and reads; it runs nothing but what ``--run-conformance`` asks for (the
conformance suite, in a subprocess, its reports written under ``--out``). The data is built by
:mod:`hwrun.report`; docs/report.md explains each section and the JSON schema.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hwrun.errors import HwrunError, UsageError

if TYPE_CHECKING:
    from hwrun.kv.specs import ModelSpec

DEFAULT_OUT = "reports/report"
DEFAULT_MODELS = ("kimi-k3.1-pro", "deepseek-v3.2")


def _formats(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    from hwrun.report.render import FORMATS

    chosen = tuple(dict.fromkeys(f.strip() for f in value.split(",") if f.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise click.BadParameter(
            f"{value!r}: formats are a comma-separated subset of {', '.join(FORMATS)}"
        )
    return chosen


@click.command()
@click.option(
    "--platform",
    "platform_name",
    default="all",
    show_default=True,
    help="A platform name, 'auto', or 'all'.",
)
@click.option(
    "--conformance",
    "conformance_files",
    multiple=True,
    metavar="RESULTS.jsonl",
    help="Conformance results to show (repeatable); the run.json beside each names its device.",
)
@click.option(
    "--run-conformance",
    is_flag=True,
    help="Run `hwrun conformance` on the platform(s) first and show its results.",
)
@click.option("--quick", is_flag=True, help="With --run-conformance: only the quick cases.")
@click.option(
    "--bench",
    "bench_files",
    multiple=True,
    metavar="BENCH.json",
    help="Benchmark JSON written by bench/gpu_ops.py, bench/moe_gpu.py or bench/engine_decode.py "
    "(repeatable).",
)
@click.option(
    "--models",
    "model_names",
    multiple=True,
    metavar="NAME|config.json",
    help=f"Models for the capacity section (repeatable; default {', '.join(DEFAULT_MODELS)}).",
)
@click.option(
    "--kv-budget",
    type=click.FloatRange(min=1, min_open=False),
    default=None,
    help="KV pool bytes per GPU for the capacity section (default 100e9).",
)
@click.option(
    "--merge",
    is_flag=True,
    help="Instead of the report, merge the RESULTS.jsonl files given as arguments (several "
    "machines' conformance results) into support-matrix.md.",
)
@click.argument("merge_files", nargs=-1, metavar="[RESULTS.jsonl]...")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Directory the files are written to.",
)
@click.option(
    "--format",
    "formats",
    default="html,md,json",
    show_default=True,
    callback=_formats,
    help="Comma-separated: html, md, json.",
)
def report(
    platform_name: str,
    conformance_files: tuple[str, ...],
    run_conformance: bool,
    quick: bool,
    bench_files: tuple[str, ...],
    model_names: tuple[str, ...],
    kv_budget: float | None,
    merge: bool,
    merge_files: tuple[str, ...],
    out_dir: Path,
    formats: tuple[str, ...],
) -> None:
    """Write the platform capability report, or (--merge) the support matrix."""
    if merge_files and not merge:
        raise click.UsageError(
            f"{merge_files[0]!r}: results files as arguments need --merge; "
            "the report takes them with --conformance FILE"
        )
    if merge:
        if not merge_files:
            raise click.UsageError("--merge needs the results.jsonl files to merge as arguments")
        _merge(merge_files, out_dir, formats, (conformance_files, run_conformance, bench_files))
        return
    if quick and not run_conformance:
        raise click.UsageError("--quick applies to --run-conformance only")
    from hwrun.plugins import load_plugins
    from hwrun.report.build import build_report
    from hwrun.report.capacity import DEFAULT_KV_BUDGET
    from hwrun.report.results import load_sources

    plugin_set = load_plugins()
    try:
        names = (
            plugin_set.names()
            if platform_name == "all"
            else [plugin_set.choose_platform(platform_name)]
        )
    except HwrunError as err:  # an unknown or unusable platform: what is loaded is listed
        raise click.BadParameter(str(err), param_hint="--platform") from None
    models = [_model(name) for name in model_names or DEFAULT_MODELS]
    paths = list(conformance_files)
    out_dir.mkdir(parents=True, exist_ok=True)
    if run_conformance:
        paths.append(str(_run_conformance(platform_name, quick, out_dir / "conformance")))
    data = build_report(
        plugin_set,
        names,
        load_sources(paths),
        list(bench_files),
        models,
        int(kv_budget or DEFAULT_KV_BUDGET),
    )
    _write(out_dir, "report", formats, data)


def _model(name: str) -> ModelSpec:
    from hwrun.models import ConfigError, UnknownModelError, get_model

    try:
        return get_model(name)
    except (UnknownModelError, ConfigError) as err:
        raise click.BadParameter(str(err), param_hint="--models") from None


def _run_conformance(platform_name: str, quick: bool, directory: Path) -> Path:
    """`hwrun conformance` in a subprocess (its isolation and timeouts as when run alone);
    exit 1 (not conformant) still gives results to show."""
    command = [
        sys.executable,
        "-c",
        "from hwrun.cli import main; main()",
        "conformance",
        "--platform",
        platform_name,
        "--report",
        str(directory),
        *(["--quick"] if quick else []),
    ]
    click.echo(f"running: hwrun {' '.join(command[3:])}", err=True)
    done = subprocess.run(command, check=False)
    results = directory / "results.jsonl"
    if done.returncode not in (0, 1) or not results.is_file():
        raise UsageError(
            f"hwrun conformance exited {done.returncode} without results in {directory}; "
            "run it alone to see why"
        )
    return results


def _merge(files: tuple[str, ...], out_dir: Path, formats: tuple[str, ...], others: tuple) -> None:
    from hwrun.report.render import render_json
    from hwrun.report.results import load_sources
    from hwrun.report.support_matrix import merged, support_matrix_markdown

    if any(others):
        raise click.UsageError(
            "--merge writes the support matrix from results files alone; "
            "--conformance, --run-conformance and --bench belong to the report"
        )
    if "html" in formats:
        raise click.UsageError("--merge writes md and json; drop html from --format")
    data = merged(load_sources(list(files)))
    # Without --out: the file must not depend on where it was written.
    command = f"hwrun report --merge {' '.join(files)} --format {','.join(formats)}"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if "md" in formats:
        (out_dir / "support-matrix.md").write_text(support_matrix_markdown(data, command))
        written.append("support-matrix.md")
    if "json" in formats:
        (out_dir / "support-matrix.json").write_text(render_json(data))
        written.append("support-matrix.json")
    click.echo(f"wrote {', '.join(written)} to {out_dir}/")


def _write(out_dir: Path, stem: str, formats: tuple[str, ...], data: dict) -> None:
    from hwrun.report.render import render_html, render_json, render_markdown

    renderers = {"html": render_html, "md": render_markdown, "json": render_json}
    for fmt in formats:
        (out_dir / f"{stem}.{fmt}").write_text(renderers[fmt](data))
    click.echo(f"wrote {', '.join(f'{stem}.{f}' for f in formats)} to {out_dir}/")
