"""Conformance results as the report reads them: one :class:`ResultSource` per results.jsonl,
with the machine it ran on.

A results.jsonl row does not name its device; the run.json that ``hwrun conformance --report``
writes beside it does (per platform, with the date, commit, mode and whether Triton's
interpreter stood in for a GPU). A source keeps that run's facts, so results merged from several
machines keep each one's device and date. Without a run.json the device is "unknown", and the
report says so rather than guess.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwrun.errors import UsageError

# Worst first: the order counts are written in, and which status decides a cell's state.
SEVERITY = (
    "CRASH",
    "TIMEOUT",
    "FAIL",
    "KNOWN_FAILURE",
    "QUALITY_WARNING",
    "PASS",
    "NOT_SUPPORTED",
)
FAILING = frozenset({"CRASH", "TIMEOUT", "FAIL"})
AUDIT_OP = "capabilities"  # the capability audit's rows, not an op


@dataclass(frozen=True)
class ResultSource:
    """One results.jsonl and the run that wrote it."""

    path: str  # as given on the command line
    name: str  # short label: the folder holding the file, or the file's stem
    rows: tuple[dict[str, Any], ...]
    run: dict[str, Any] | None = field(default=None, compare=False)  # run.json, when present

    @property
    def date(self) -> str | None:
        return self.fact("date")

    @property
    def commit(self) -> str | None:
        return self.fact("commit")

    @property
    def mode(self) -> str | None:
        return self.fact("mode")

    @property
    def interpreted(self) -> bool | None:
        """Whether Triton's interpreter ran the Triton kernels (None: not recorded)."""
        return self.fact("triton_interpret")

    def fact(self, key: str) -> Any:
        """A field of the run's run.json (None without one, or when it lacks the field)."""
        return self.run.get(key) if self.run else None

    def platforms(self) -> list[str]:
        return list(dict.fromkeys(r["platform"] for r in self.rows))

    def device(self, platform: str) -> str:
        """Where ``platform``'s rows ran: run.json's Target line ("cuda: 1 x NVIDIA H200
        (sm_90, 140 GiB)"), "cpu" for the reference (which always runs on the host), or
        "unknown" without a run.json."""
        if self.run is None:
            return "unknown (no run.json beside the results)"
        devices = self.run.get("devices") or {}
        if platform in devices:
            return devices[platform]
        if platform == "reference":
            return "cpu"
        return "unknown (run.json does not name it)"

    def on_hardware(self, platform: str) -> bool:
        """True when ``platform``'s rows ran on an accelerator, not on the CPU."""
        device = self.device(platform)
        return not (device.startswith("cpu") or device.startswith("unknown"))

    def where(self, platform: str) -> str:
        """The device line, with "Triton interpreter" when it stood in for a GPU."""
        device = self.device(platform)
        if self.interpreted and device.startswith("cpu") and platform != "reference":
            return f"{device} (Triton interpreter)"
        return device

    def counts(self, platform: str, op: str) -> dict[str, int]:
        """Status counts of ``op`` on ``platform``, worst first; empty when it has no rows."""
        found = Counter(
            r["status"] for r in self.rows if r["platform"] == platform and r["op"] == op
        )
        return {s: found[s] for s in SEVERITY if found[s]}

    def describe(self) -> dict[str, Any]:
        """The source as report.json lists it."""
        return {
            "name": self.name,
            "path": self.path,
            "rows": len(self.rows),
            "date": self.date,
            "commit": self.commit,
            "mode": self.mode,
            "triton_interpret": self.interpreted,
            "host": self.fact("host"),
            "torch": self.fact("torch"),
            "platforms": {p: self.where(p) for p in self.platforms()},
        }


def load_source(path: str | Path) -> ResultSource:
    """A results.jsonl and the run.json beside it (if any). A missing or malformed file is a
    usage error naming the file, the line and what was expected."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(
            f"{path}: no such results file; give the results.jsonl that "
            "`hwrun conformance --report DIR` wrote"
        )
    rows = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{number}: not JSON ({err.msg})") from None
        missing = [k for k in ("platform", "op", "case", "status") if k not in row]
        if not isinstance(row, dict) or missing:
            raise UsageError(
                f"{path}:{number}: not a conformance row (missing {', '.join(missing) or 'all'}; "
                "rows have platform, op, case, status)"
            )
        if row["status"] not in SEVERITY:
            raise UsageError(
                f"{path}:{number}: unknown status {row['status']!r}; known: {', '.join(SEVERITY)}"
            )
        rows.append(row)
    run = None
    run_file = file.with_name("run.json")
    if run_file.is_file():
        try:
            run = json.loads(run_file.read_text())
        except json.JSONDecodeError as err:
            raise UsageError(f"{run_file}: not JSON ({err.msg})") from None
    name = file.parent.name if file.name == "results.jsonl" and file.parent.name else file.stem
    return ResultSource(str(path), name, tuple(rows), run)


def load_sources(paths: list[str]) -> list[ResultSource]:
    """Every file, in the order given; two with the same label get their paths as labels."""
    sources = [load_source(p) for p in paths]
    labels = Counter(s.name for s in sources)
    return [
        ResultSource(s.path, s.path, s.rows, s.run) if labels[s.name] > 1 else s for s in sources
    ]


def state_of(counts: dict[str, int]) -> str:
    """One word for a cell: "failing", "known failure", "warning", "pass", "not supported",
    or "untested" (no rows)."""
    if not counts:
        return "untested"
    if FAILING & counts.keys():
        return "failing"
    if "KNOWN_FAILURE" in counts:
        return "known failure"
    if "QUALITY_WARNING" in counts:
        return "warning"
    if "PASS" in counts:
        return "pass"
    return "not supported"


def cell_text(counts: dict[str, int]) -> str:
    """Counts worst first, e.g. "FAIL 3 · PASS 24"; "-" for none."""
    return " · ".join(f"{status} {n}" for status, n in counts.items()) or "-"
