"""The platform capability report (`hwrun report`): which ops and formats each platform serves
here and with which impl, its conformance results, KV capacity of chosen models, benchmarks;
rendered as report.html (self-contained, plots inline as SVG), report.md and report.json; and
the support matrix merged from several machines' conformance results.

It collects and renders; it runs nothing (``hwrun report --run-conformance`` runs the suite
through its own command first). docs/report.md describes every section and the JSON schema.
"""

from hwrun.report.build import REPORT_SCHEMA, build_report
from hwrun.report.results import ResultSource, load_source, load_sources
from hwrun.report.support_matrix import MERGE_SCHEMA, merged, support_matrix_markdown

__all__ = [
    "MERGE_SCHEMA",
    "REPORT_SCHEMA",
    "ResultSource",
    "build_report",
    "load_source",
    "load_sources",
    "merged",
    "support_matrix_markdown",
]
