"""`hwrun conformance`: run the suite on one platform or all, print and write the reports.

Exit codes: 0 every selected platform conforms (with ``--platform all``, a platform that ran
nothing here also leaves 0: its verdict says why), 1 one does not, is broken, or (named alone)
ran nothing, 2 usage error, 130 interrupted (the partial report is written).
"""

from __future__ import annotations

import math
import secrets
import sys
import tempfile
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hwrun import knobs
from hwrun.errors import HwrunError
from hwrun.plugins import load_plugins
from hwrun_conformance.known_failures import KNOWN_FAILURES, load_known_failures
from hwrun_conformance.metadata import run_metadata
from hwrun_conformance.report import STYLE, summary_tables, verdict_line, verdicts, write_reports
from hwrun_conformance.result import Result
from hwrun_conformance.runner import Plan, RunOptions, run, unusable_plugins
from hwrun_conformance.status import DEFAULT_TIMEOUT_S, INTERPRETER_TIMEOUT_S, Status
from hwrun_conformance.verdict import BROKEN, DOES_NOT_CONFORM, NOTHING_RUN

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report it


def _finite_seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float:
    if value is None:
        return INTERPRETER_TIMEOUT_S if knobs.triton_interpret() else DEFAULT_TIMEOUT_S
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"{value!r} is not a number of seconds > 0 (finite)")
    return value


@click.command()
@click.option("--platform", "platform_name", default=None, help="A platform name, or 'all'.")
@click.option("--ops", "ops_glob", default="*", show_default=True, help="Glob over op names.")
@click.option("--quick", is_flag=True, help="Only the quick cases (the CI subset).")
@click.option(
    "--fuzz",
    type=click.IntRange(min=1),
    default=None,
    help="Instead of the named cases, N random specs per op from its documented domain.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Seed of --fuzz (default: a fresh one, printed so the run can be replayed).",
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write results.jsonl, summary.md, junit.xml and run.json into this directory.",
)
@click.option(
    "--timeout",
    type=float,
    callback=_finite_seconds,
    default=None,
    help=f"Seconds one case may run before it is killed (TIMEOUT); default {DEFAULT_TIMEOUT_S:g}, "
    f"{INTERPRETER_TIMEOUT_S:g} under TRITON_INTERPRET=1.",
)
@click.option(
    "--known-failures",
    "known_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="TOML file of known-failure entries (added to the built-in table).",
)
@click.option(
    "--accept-known-failures",
    is_flag=True,
    help="Let KNOWN_FAILURE cases count as conformant for the exit code.",
)
@click.option(
    "--device", default=None, help="Torch device for the impls (default: the platform's)."
)
def conformance(
    platform_name: str | None,
    ops_glob: str,
    quick: bool,
    fuzz: int | None,
    seed: int | None,
    report_dir: Path | None,
    timeout: float,
    known_file: Path | None,
    accept_known_failures: bool,
    device: str | None,
) -> None:
    """Check platforms' own op implementations against the reference (docs/conformance.md)."""
    from hwrun.ops.catalogue import catalogue

    if seed is not None and fuzz is None:
        raise click.UsageError("--seed applies to --fuzz N only")
    if fuzz is not None and quick:
        raise click.UsageError("--quick selects named cases; --fuzz replaces them: pick one")
    plugins = load_plugins()
    try:
        platforms = (
            plugins.names() if platform_name == "all" else [plugins.choose_platform(platform_name)]
        )
    except HwrunError as err:
        raise click.UsageError(str(err)) from err
    ops = list(catalogue())
    if not any(fnmatchcase(op, ops_glob) for op in ops):
        raise click.UsageError(f"--ops {ops_glob!r} matches no op; ops: {', '.join(ops) or 'none'}")
    known = KNOWN_FAILURES
    if known_file is not None:
        try:
            known = known + load_known_failures(known_file)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--known-failures") from err
    if report_dir is not None:
        _check_writable(report_dir)
    if fuzz is not None and seed is None:
        seed = secrets.randbelow(1 << 31)
    options = RunOptions(
        ops=ops_glob,
        quick=quick,
        timeout=timeout,
        known_failures=known,
        accept_known_failures=accept_known_failures,
        device=device,
        fuzz=fuzz or 0,
        seed=seed or 0,
    )
    mode = "fuzz" if fuzz else "quick" if quick else "full"
    fuzz_facts = {"count": fuzz, "seed": seed} if fuzz else None

    out = Console(soft_wrap=True, stderr=False)
    if fuzz:
        out.print(f"fuzz: {fuzz} specs per op, seed {seed}", highlight=False)
    results: list[Result] = [] if platform_name != "all" else unusable_plugins(plugins)
    plans: dict[str, Plan] = {}
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    interrupted = False
    with Progress(*columns, console=out, transient=True, disable=not out.is_terminal) as progress:
        task = progress.add_task("conformance", total=None)

        def on_result(result: Result) -> None:
            results.append(result)
            progress.update(task, advance=1, description=f"{result.platform} {result.op}")

        try:
            run(
                plugins,
                platforms,
                options,
                on_result=on_result,
                on_planned=lambda total: progress.update(task, total=total),
                on_plans=plans.update,
            )
        except KeyboardInterrupt:
            interrupted = True
    metadata = run_metadata(plugins, options, plans, mode, fuzz_facts)
    metadata["interrupted"] = interrupted
    _print(out, results, accept_known_failures, fuzz_facts, platform_name)
    if report_dir is not None:
        write_reports(results, report_dir, accept_known_failures, metadata)
        files = "results.jsonl, summary.md, junit.xml, run.json"
        out.print(f"reports written to {report_dir}/ ({files})")
    if interrupted:
        out.print("interrupted: the results above and in the report are partial")
        sys.exit(INTERRUPTED_EXIT)
    failing = {DOES_NOT_CONFORM, BROKEN} | ({NOTHING_RUN} if platform_name != "all" else set())
    if any(v.state in failing for v in verdicts(results, accept_known_failures)):
        sys.exit(1)


def _check_writable(directory: Path) -> None:
    """Fail before the run, not after it, when the report cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise click.BadParameter(
            f"cannot write reports into {directory}: {err.strerror or err}",
            param_hint="--report",
        ) from err


def _print(
    out: Console,
    results: list[Result],
    accept_known: bool,
    fuzz: dict[str, Any] | None,
    platform_name: str | None,
) -> None:
    for table in summary_tables(results, width=out.width):
        out.print(table)
    for result in results:
        if result.status not in {Status.PASS, Status.NOT_SUPPORTED}:
            style = STYLE[result.status]
            impl = f" [{result.impl}]" if result.impl else ""
            out.print(
                f"[{style}]{result.status}[/{style}] {result.platform} {result.op} "
                f"{result.case}{escape(impl)}: {escape(result.reason)}",
                markup=True,
                highlight=False,
            )
            if fuzz and result.case.startswith("fuzz") and result.about:
                replay = f"--platform {result.platform} --ops {result.op} --fuzz {fuzz['count']}"
                out.print(
                    f"  seed {fuzz['seed']}, spec: {escape(result.about)}\n"
                    f"  replay: hwrun conformance {replay} --seed {fuzz['seed']}",
                    highlight=False,
                )
    for verdict in verdicts(results, accept_known):
        out.print(verdict_line(verdict), highlight=False)
    if not results:
        out.print(f"no platform to run: none is loaded ({platform_name})")
