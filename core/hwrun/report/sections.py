"""The report's sections as tables of text, from report.json's data: report.md and report.html
render the same tables (HTML adds the plots beside the capacity and benchmark ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwrun.report.plots import Plot, bench_plots, capacity_plots
from hwrun.report.results import cell_text


@dataclass(frozen=True)
class Table:
    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    id: str = ""


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    lines: tuple[str, ...] = ()  # paragraphs before the tables
    tables: tuple[Table, ...] = ()
    plots: tuple[Plot, ...] = ()  # each drawn with its own table (HTML); Markdown: the tables
    notes: tuple[str, ...] = field(default=())  # list items after the tables


def sections(report: dict[str, Any], with_plots: bool) -> list[Section]:
    """Every section in order; ``with_plots`` draws the SVGs (HTML only)."""
    return [
        _platforms(report),
        _ops(report),
        _formats(report),
        _conformance(report),
        *_capacity(report, with_plots),
        _bench(report, with_plots),
    ]


def platform_names(report: dict[str, Any]) -> list[str]:
    return list(report["ops"][0]["platforms"]) if report["ops"] else []


def _platforms(report: dict[str, Any]) -> Section:
    rows = tuple(
        (
            p["name"],
            p["version"] or "-",
            p["api_version"] or "-",
            p["status"],
            p["target"] or "-",
            "; ".join(p["device_reasons"]) or "-",
            p["serves"],
        )
        for p in report["platforms"]
    )
    return Section(
        "platforms",
        "Platforms",
        ("Each discovered plugin, where it runs on this host (its Target), and what it serves.",),
        (
            Table(
                "",
                (
                    "platform",
                    "version",
                    "hook API",
                    "status",
                    "runs on",
                    "why not a device",
                    "serves",
                ),
                rows,
                "platforms-table",
            ),
        ),
    )


def op_cell(cell: dict[str, Any]) -> str:
    """One op on one platform in one line: impl (tier), claim, hardware note, conformance."""
    if cell["impl"] is None:
        parts = ["**absent**"]
    elif cell["fallback"] or cell["tier"] == cell["impl"]:
        parts = [cell["tier"]]  # "reference fallback", or the reference platform's own
    else:
        parts = [f"{cell['impl']} ({cell['tier']})"]
    parts.append("claimed" if cell["claimed"] else "not claimed")
    if cell["hardware"]:
        parts.append(cell["hardware"])
    for result in cell["conformance"]:
        parts.append(f"{result['source']}: {cell_text(result['counts'])}")
    if cell["state"] == "failing":
        parts.append("**FAILING**")
    return "; ".join(parts)


def _ops(report: dict[str, Any]) -> Section:
    names = platform_names(report)
    rows = tuple(
        (f"`{row['op']}`", *(op_cell(row["platforms"][p]) for p in names)) for row in report["ops"]
    )
    return Section(
        "ops",
        "Op x platform",
        (
            "For each catalogue op, the impl that serves its default spec on each platform's "
            "Target here and its tier (vendor library, portable Triton, Pallas, torch, reference "
            "fallback, or absent), whether the platform claims the op, what the plugin says about "
            "its impls on hardware, and the conformance counts of each results file given.",
        ),
        (Table("", ("op", *names), rows, "ops-table"),),
    )


def _formats(report: dict[str, Any]) -> Section:
    names = platform_names(report)

    def text(cell: dict[str, Any]) -> str:
        parts = []
        if cell["served_by_own_impls"]:
            parts.append("served: " + ", ".join(cell["served_by_own_impls"]))
        if cell["reference_fallback"] and cell["served_by_own_impls"]:
            parts.append("reference fallback: " + ", ".join(cell["reference_fallback"]))
        elif cell["reference_fallback"]:
            parts.append("reference fallback")
        if not parts:
            parts.append("not served")
        parts.append("claimed" if cell["claimed"] else "not claimed")
        if cell["conformance"]:
            parts.append(cell_text(cell["conformance"]))
        return "; ".join(parts)

    rows = tuple(
        (row["family"], row["format"], *(text(row["platforms"][p]) for p in names))
        for row in report["formats"]
    )
    return Section(
        "formats",
        "Formats",
        (
            "Latent, index-key and MoE weight formats: which of the family's ops each platform's "
            "own impls serve in the format here, which the reference serves in its place, the "
            "claim, and the conformance counts of the cases that use the format.",
        ),
        (Table("", ("family", "format", *names), rows, "formats-table"),),
    )


def _conformance(report: dict[str, Any]) -> Section:
    rows = tuple(
        (
            s["name"],
            "; ".join(f"{p}: {where}" for p, where in s["platforms"].items()),
            s["date"] or "unknown",
            s["commit"] or "unknown",
            s["mode"] or "unknown",
            str(s["rows"]),
        )
        for s in report["conformance"]
    )
    lines = (
        ("Results files read (`--conformance`, `--run-conformance`), each with its own device.",)
        if rows
        else ("No conformance results were given (`--conformance FILE` or `--run-conformance`).",)
    )
    tables = (
        (Table("", ("source", "platforms and devices", "date", "commit", "mode", "rows"), rows),)
        if rows
        else ()
    )
    return Section("conformance", "Conformance results", lines, tables)


def _capacity(report: dict[str, Any], with_plots: bool) -> list[Section]:
    out = []
    for model in report["capacity"]:
        plots = capacity_plots(model)
        refused = tuple(
            f"{r['gpus']} GPUs {r['mode']} (TP{r['tp']} DCP{r['dcp']}): {'; '.join(r['refused'])}"
            for r in model["pool"]
            if "refused" in r
        )
        out.append(
            Section(
                f"capacity-{model['model']}",
                f"Capacity: {model['model']}",
                (
                    f"Latent {model['latent_format']}, index keys {model['index_format']}; "
                    f"KV budget {model['kv_budget_per_gpu']:,} B per GPU (`--kv-budget`). "
                    "Bytes per token from the layer specs; pool and concurrency from the packed "
                    "block planner (as `hwrun plan`).",
                ),
                () if with_plots else tuple(Table(p.title, p.header, p.rows) for p in plots),
                tuple(plots) if with_plots else (),
                refused + tuple(f"assumed: {a}" for a in model["assumptions"]),
            )
        )
    return out


def _bench(report: dict[str, Any], with_plots: bool) -> Section:
    benches = report["bench"]
    if not benches:
        return Section(
            "bench",
            "Benchmarks",
            ("No benchmark files were given (`--bench FILE`).",),
        )
    lines = tuple(
        f"{b['bench']} ({b['path']}): card {b['card']}, date {b['date']}, commit {b['commit']}"
        + (f"; {b['source']}" if b["source"] else "")
        for b in benches
    )
    plots = bench_plots(benches)
    tables = tuple(
        Table(
            f"{b['bench']}",
            ("op", "shape", "impl", "us", "% of roofline", "peers (us)", "hwrun / peer", "note"),
            tuple(
                (
                    r["op"],
                    r["shape"],
                    r["impl"],
                    f"{r['us']:.1f}",
                    "-" if r["percent_of_roofline"] is None else f"{r['percent_of_roofline']:.0f}%",
                    ", ".join(f"{k} {v:.1f}" for k, v in r["peers"].items()) or "-",
                    ", ".join(f"{v:.2f}x {k}" for k, v in r["vs_peer"].items()) or "-",
                    r["note"] or "",
                )
                for r in b["rows"]
            ),
        )
        for b in benches
    )
    return Section("bench", "Benchmarks", lines, tables, tuple(plots) if with_plots else ())
