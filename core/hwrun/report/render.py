"""report.md, report.html and report.json from the report's data.

report.html is one self-contained file: styles inline, plots inline as SVG, no script and no
network, so it reads the same in a browser without JavaScript, from a CI artifact or a mail.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from hwrun.report.sections import Section, Table, sections

FORMATS = ("html", "md", "json")


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2) + "\n"


def _header_lines(report: dict[str, Any]) -> list[str]:
    made = report["generated"]
    return [
        f"hwrun {made['hwrun']} (hook API {made['hook_api']}), "
        f"commit {made['commit'] or 'unknown'}, generated {made['date']}."
    ]


def render_markdown(report: dict[str, Any]) -> str:
    lines = ["# hwrun report", "", *_header_lines(report), ""]
    for section in sections(report, with_plots=False):
        lines += [f"## {section.title}", ""]
        for paragraph in section.lines:
            lines += [paragraph, ""]
        for table in section.tables:
            lines += markdown_table(table)
        if section.notes:
            lines += [*(f"- {_md(note)}" for note in section.notes), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def markdown_table(table: Table) -> list[str]:
    lines = [f"**{_md(table.caption)}**", ""] if table.caption else []
    lines.append("| " + " | ".join(_md(h) for h in table.header) + " |")
    lines.append("|" + "---|" * len(table.header))
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in table.rows]
    return [*lines, ""]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1.5em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; text-align: left; }
th { background: #f0f0f0; }
td.failing { background: #f8d7d5; }
td.absent { background: #eeeeee; color: #666; }
td.fallback { background: #fff4d6; }
td.served { background: #e3f1df; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
.figure { display: flex; flex-wrap: wrap; gap: 1.2em; align-items: flex-start; }
.figure svg { max-width: 640px; height: auto; }
.plot h3 { font-size: 1em; margin: 0.8em 0 0.3em; }
code { background: #f4f4f4; padding: 0 2px; }
""".strip()


def render_html(report: dict[str, Any]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>hwrun report</title>",
        f"<style>\n{STYLE}\n</style></head><body>",
        "<h1>hwrun report</h1>",
        *(f"<p>{_inline(line)}</p>" for line in _header_lines(report)),
    ]
    all_sections = sections(report, with_plots=True)
    parts.append(
        "<nav>"
        + "".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in all_sections)
        + "</nav>"
    )
    for section in all_sections:
        parts += _html_section(section)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _html_section(section: Section) -> list[str]:
    out = [f'<section id="{section.id}">', f"<h2>{html.escape(section.title)}</h2>"]
    out += [f"<p>{_inline(line)}</p>" for line in section.lines]
    out += [_html_table(table) for table in section.tables]
    for plot in section.plots:
        out += [
            f'<div class="plot" id="plot-{plot.id}">',
            f"<h3>{html.escape(plot.title)}</h3>",
            '<div class="figure">',
            _scoped(plot.svg, plot.id),
            _html_table(Table("", plot.header, plot.rows)),
            "</div></div>",
        ]
    if section.notes:
        out.append("<ul>" + "".join(f"<li>{_inline(n)}</li>" for n in section.notes) + "</ul>")
    out.append("</section>")
    return out


def _scoped(svg: str, prefix: str) -> str:
    """The SVG with its ids (and the references to them) prefixed, so several inline plots do
    not share an id (matplotlib names its clip paths and groups alike in every figure)."""
    svg = re.sub(r' id="([^"]+)"', rf' id="{prefix}-\1"', svg)
    return re.sub(r'(url\(#|href="#)', rf"\1{prefix}-", svg)


def _html_table(table: Table) -> str:
    table_id = f' id="{table.id}"' if table.id else ""
    caption = f"<caption>{_inline(table.caption)}</caption>" if table.caption else ""
    head = "<tr>" + "".join(f"<th>{_inline(h)}</th>" for h in table.header) + "</tr>"
    body = "".join(
        "<tr>" + "".join(_html_cell(c, first=(i == 0)) for i, c in enumerate(row)) + "</tr>"
        for row in table.rows
    )
    return f"<table{table_id}>{caption}<thead>{head}</thead><tbody>{body}</tbody></table>"


def _html_cell(text: str, first: bool) -> str:
    kind = ""
    if not first:
        if "**FAILING**" in text:
            kind = "failing"
        elif text.startswith("**absent**") or text.startswith("not served"):
            kind = "absent"
        elif text.startswith("reference fallback"):
            kind = "fallback"
        elif "(portable Triton)" in text or "(vendor library)" in text or "served:" in text:
            kind = "served"
    attribute = f' class="{kind}"' if kind else ""
    return f"<td{attribute}>{_inline(text)}</td>"


def _inline(text: str) -> str:
    """Escape, then the two Markdown marks the tables use: **bold** and `code`."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)
