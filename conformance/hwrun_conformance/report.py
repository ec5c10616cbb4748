"""Reports of a run: results.jsonl (one object per case), summary.md (op x platform), junit.xml,
and the console summary table."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from rich import box
from rich.markup import escape
from rich.table import Table

from hwrun_conformance.metadata import describe
from hwrun_conformance.result import Result
from hwrun_conformance.status import Status
from hwrun_conformance.verdict import CONFORMS, NOTHING_RUN, PlatformVerdict, platform_verdict

STYLE = {
    Status.PASS: "green",
    Status.NOT_SUPPORTED: "dim",
    Status.QUALITY_WARNING: "yellow",
    Status.KNOWN_FAILURE: "magenta",
    Status.FAIL: "red",
    Status.CRASH: "bold red",
    Status.TIMEOUT: "bold red",
}


def write_reports(
    results: list[Result],
    directory: Path,
    accept_known: bool = False,
    metadata: dict[str, Any] | None = None,
) -> None:
    """results.jsonl, summary.md, junit.xml and (with ``metadata``) run.json into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "results.jsonl").open("w") as handle:
        for result in results:
            handle.write(json.dumps(_row(result)) + "\n")
    (directory / "summary.md").write_text(summary_markdown(results, accept_known, metadata))
    ET.ElementTree(junit(results, metadata)).write(
        directory / "junit.xml", encoding="utf-8", xml_declaration=True
    )
    if metadata is not None:
        (directory / "run.json").write_text(json.dumps(metadata, indent=2) + "\n")


def verdicts(results: list[Result], accept_known: bool = False) -> list[PlatformVerdict]:
    return [platform_verdict(results, p, accept_known) for p in platforms_of(results)]


def _row(result: Result) -> dict:
    row = asdict(result)
    row["status"] = str(result.status)
    row["formats"] = list(result.formats)
    row["refusals"] = [list(pair) for pair in result.refusals]
    if row["value"] is not None and not math.isfinite(row["value"]):
        row["value"] = str(row["value"])  # JSON has no inf/nan
    return row


def platforms_of(results: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.platform for r in results))


def ops_of(results: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.op for r in results))


# Console cells are narrow: short names there, full names in summary.md.
SHORT = {
    Status.PASS: "pass",
    Status.FAIL: "FAIL",
    Status.NOT_SUPPORTED: "n/s",
    Status.QUALITY_WARNING: "warn",
    Status.KNOWN_FAILURE: "known",
    Status.CRASH: "CRASH",
    Status.TIMEOUT: "T/O",
}


def cell(results: list[Result], short: bool = False) -> str:
    """One op on one platform: statuses worst first, with counts (e.g. "FAIL 1 · PASS 11")."""
    if not results:
        return "-"
    counts = Counter(r.status for r in results)
    order = [s for s in _SEVERITY if s in counts]
    return " · ".join(f"{SHORT[s] if short else s} {counts[s]}" for s in order)


_SEVERITY = (
    Status.CRASH,
    Status.TIMEOUT,
    Status.FAIL,
    Status.KNOWN_FAILURE,
    Status.QUALITY_WARNING,
    Status.PASS,
    Status.NOT_SUPPORTED,
)


def summary_markdown(
    results: list[Result], accept_known: bool = False, metadata: dict[str, Any] | None = None
) -> str:
    platforms = platforms_of(results)
    grouped: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for result in results:
        grouped[(result.op, result.platform)].append(result)
    lines = ["# hwrun conformance", ""]
    if metadata is not None:
        lines += [*describe(metadata), ""]
    lines.append("| op | " + " | ".join(platforms) + " |")
    lines.append("|---|" + "---|" * len(platforms))
    for op in ops_of(results):
        cells = [cell(grouped[(op, p)]) for p in platforms]
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    states = [
        v.state if v.state in {CONFORMS, NOTHING_RUN} else f"**{v.state}**"
        for v in verdicts(results, accept_known)
    ]
    lines.append("| **verdict** | " + " | ".join(states) + " |")
    lines += ["", "## Verdicts", ""]
    lines += [f"- {_md(v.line())}" for v in verdicts(results, accept_known)]
    problems = [r for r in results if r.status not in {Status.PASS, Status.NOT_SUPPORTED}]
    if problems:
        lines += [
            "",
            "## Cases that did not pass",
            "",
            "| platform | op | case | impl | status | reason |",
        ]
        lines.append("|---|---|---|---|---|---|")
        lines += [
            f"| {r.platform} | `{r.op}` | {r.case} | {r.impl or '-'} | {r.status} "
            f"| {_md(r.reason)} |"
            for r in problems
        ]
    relaxed = [r for r in results if r.relaxation]
    if relaxed:
        lines += ["", "## Relaxed tolerances", ""]
        lines += [f"- {r.platform} `{r.op}` {r.case}: {r.relaxation}" for r in relaxed]
    audit = [r for r in results if r.op == "capabilities"]
    if audit:
        lines += ["", "## Capability audit", ""]
        lines += [f"- {r.platform} {r.case}: {r.status} ({r.reason})" for r in audit]
    return "\n".join(lines) + "\n"


def junit(results: list[Result], metadata: dict[str, Any] | None = None) -> ET.Element:
    root = ET.Element("testsuites", name="hwrun-conformance")
    if metadata is not None:
        properties = ET.SubElement(root, "properties")
        for key, value in metadata.items():
            text = value if isinstance(value, str) else json.dumps(value)
            ET.SubElement(properties, "property", name=key, value=text)
    for platform in platforms_of(results):
        rows = [r for r in results if r.platform == platform]
        counts = Counter(r.status for r in rows)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"hwrun-conformance.{platform}",
            tests=str(len(rows)),
            failures=str(counts[Status.FAIL] + counts[Status.KNOWN_FAILURE]),
            errors=str(counts[Status.CRASH] + counts[Status.TIMEOUT]),
            skipped=str(counts[Status.NOT_SUPPORTED]),
            time=f"{sum(r.seconds for r in rows):.3f}",
        )
        for r in rows:
            name = f"{r.case}[{r.impl}]" if r.impl else r.case
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{platform}.{r.op}",
                name=name,
                time=f"{r.seconds:.3f}",
            )
            message = f"{r.status}: {r.reason}" if r.reason else str(r.status)
            if r.status == Status.NOT_SUPPORTED:
                ET.SubElement(case, "skipped", message=message)
            elif r.status in {Status.FAIL, Status.KNOWN_FAILURE}:
                ET.SubElement(case, "failure", message=message, type=str(r.status))
            elif r.status in {Status.CRASH, Status.TIMEOUT}:
                ET.SubElement(case, "error", message=message, type=str(r.status))
            elif r.status == Status.QUALITY_WARNING:
                ET.SubElement(case, "system-out").text = message
    return root


def summary_tables(results: list[Result], width: int = 80) -> list[Table]:
    """The op x platform matrix for a ``width``-column console: compact cells ("FAIL 2/14":
    the worst status, how many rows have it, of how many), split into several tables of fewer
    platforms when one would not fit, so no op name or cell is folded or cut. Verdicts are
    printed as lines below them (:func:`verdicts`), where they have room."""
    platforms = platforms_of(results)
    ops = ops_of(results)
    grouped: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for result in results:
        grouped[(result.op, result.platform)].append(result)
    cells = {key: _cell_text(rows) for key, rows in grouped.items()}
    op_width = max([len("op"), *map(len, ops)])
    tables: list[Table] = []
    chunk: list[str] = []
    edges = 3  # the table's outer spaces and the op column's padding
    used = op_width + edges
    for platform in platforms:
        column = max([len(platform), *(len(cells.get((op, platform), "-")) for op in ops)])
        if chunk and used + 2 + column > width:  # separator and padding: 2 per column
            tables.append(_table(chunk, ops, grouped))
            chunk, used = [], op_width + edges
        chunk.append(platform)
        used += 2 + column
    if chunk:
        tables.append(_table(chunk, ops, grouped))
    return tables


def _table(
    platforms: list[str], ops: list[str], grouped: dict[tuple[str, str], list[Result]]
) -> Table:
    table = Table(
        title="hwrun conformance (n/s = not supported, T/O = timeout)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("op", no_wrap=True)
    for platform in platforms:
        table.add_column(platform, no_wrap=True)
    for op in ops:
        table.add_row(op, *[_styled(grouped[(op, p)]) for p in platforms])
    return table


def _cell_text(results: list[Result]) -> str:
    if not results:
        return "-"
    worst = next(s for s in _SEVERITY if any(r.status == s for r in results))
    count = sum(r.status == worst for r in results)
    return f"{SHORT[worst]} {count}" + (f"/{len(results)}" if count < len(results) else "")


def _styled(results: list[Result]) -> str:
    if not results:
        return "-"
    worst = next(s for s in _SEVERITY if any(r.status == s for r in results))
    return f"[{STYLE[worst]}]{_cell_text(results)}[/{STYLE[worst]}]"


VERDICT_STYLE = {CONFORMS: "green", NOTHING_RUN: "yellow"}


def verdict_line(verdict: PlatformVerdict) -> str:
    """The console line of one platform's verdict (rich markup)."""
    style = VERDICT_STYLE.get(verdict.state, "red")
    rest = escape(verdict.line().removeprefix(f"{verdict.platform}: {verdict.state}"))
    return f"{escape(verdict.platform)}: [{style}]{verdict.state}[/{style}]{rest}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
