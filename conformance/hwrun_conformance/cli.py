"""`hwrun conformance`: run the suite on one platform or all, print and write the reports.

Exit codes: 0 every selected platform conforms, 1 one does not, 2 usage error.
"""

from __future__ import annotations

import sys
from fnmatch import fnmatchcase
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hwrun.errors import HwrunError
from hwrun.plugins import load_plugins
from hwrun_conformance.known_failures import KNOWN_FAILURES, load_known_failures
from hwrun_conformance.report import STYLE, summary_table, write_reports
from hwrun_conformance.runner import Result, RunOptions, conformant, run
from hwrun_conformance.status import DEFAULT_TIMEOUT_S, Status


@click.command()
@click.option("--platform", "platform_name", default=None, help="A platform name, or 'all'.")
@click.option("--ops", "ops_glob", default="*", show_default=True, help="Glob over op names.")
@click.option("--quick", is_flag=True, help="Only the quick cases (the CI subset).")
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write results.jsonl, summary.md and junit.xml into this directory.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds one case may run before it is killed (TIMEOUT).",
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
    report_dir: Path | None,
    timeout: float,
    known_file: Path | None,
    accept_known_failures: bool,
    device: str | None,
) -> None:
    """Check platforms' own op implementations against the reference (docs/conformance.md)."""
    from hwrun.ops.catalogue import catalogue

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
            raise click.UsageError(str(err)) from err
    options = RunOptions(
        ops=ops_glob,
        quick=quick,
        timeout=timeout,
        known_failures=known,
        accept_known_failures=accept_known_failures,
        device=device,
    )

    out = Console(soft_wrap=True, stderr=False)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out, transient=True, disable=not out.is_terminal) as progress:
        task = progress.add_task("conformance", total=None)

        def on_result(result: Result) -> None:
            progress.update(task, advance=1, description=f"{result.platform} {result.op}")

        results = run(
            plugins,
            platforms,
            options,
            on_result=on_result,
            on_planned=lambda total: progress.update(task, total=total),
        )

    out.print(summary_table(results, accept_known_failures))
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
    if report_dir is not None:
        write_reports(results, report_dir, accept_known_failures)
        out.print(f"reports written to {report_dir}/ (results.jsonl, summary.md, junit.xml)")
    if not all(conformant(results, p, accept_known_failures) for p in platforms):
        sys.exit(1)
