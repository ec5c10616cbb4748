"""Build the report's data (what report.json holds) from the plugins, the given result and
bench files and the chosen models. It asks, it does not run: selection calls only ``validate``,
capacity is arithmetic, results and benchmarks are read from files.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hwrun import API_VERSION, __version__
from hwrun.kv.specs import ModelSpec
from hwrun.plugins import PluginSet
from hwrun.report.bench import load_bench
from hwrun.report.capacity import capacity_section
from hwrun.report.platforms import format_matrix, op_matrix, platform_rows, serves_summary
from hwrun.report.results import ResultSource

REPORT_SCHEMA = "hwrun.report/1"


def build_report(
    plugin_set: PluginSet,
    platforms: list[str],
    sources: list[ResultSource],
    bench_paths: list[str],
    models: list[ModelSpec],
    kv_budget: int,
) -> dict[str, Any]:
    """The report as JSON-able data (schema in docs/report.md)."""
    from hwrun.provenance import source_commit

    ops = op_matrix(plugin_set, platforms, sources)
    rows = platform_rows(plugin_set, platforms)
    for row in rows:
        row["serves"] = serves_summary(row, ops)
    return {
        "schema": REPORT_SCHEMA,
        "generated": {
            "hwrun": __version__,
            "hook_api": API_VERSION,
            "commit": source_commit(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
        "platforms": rows,
        "ops": ops,
        "formats": format_matrix(plugin_set, platforms, sources),
        "conformance": [source.describe() for source in sources],
        "capacity": [capacity_section(model, kv_budget) for model in models],
        "bench": [load_bench(path) for path in bench_paths],
    }
