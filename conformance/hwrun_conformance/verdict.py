"""The verdict of a run per platform: conformant, not conformant, nothing run here, or broken.

A platform that ran no case here is not called conformant: its verdict is "nothing run here",
with the refusals that kept every case from running summarised (the most common validate
reasons, and the ops it does not implement), so the reader learns what to change (a GPU, an
environment variable) rather than trusting an empty run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hwrun_conformance.result import UNCOVERED
from hwrun_conformance.status import CONFORMANT, Status

if TYPE_CHECKING:
    from hwrun_conformance.result import Result

CONFORMS = "conformant"
DOES_NOT_CONFORM = "not conformant"
NOTHING_RUN = "nothing run here"
BROKEN = "broken"
PLUGIN_OP = "plugin"  # the op (and kind) of the row of a plugin that did not load or broke


@dataclass(frozen=True)
class PlatformVerdict:
    platform: str
    state: str  # CONFORMS, DOES_NOT_CONFORM, NOTHING_RUN or BROKEN
    run: int  # cases an impl of the platform ran
    passed: int  # of those, PASS or QUALITY_WARNING
    not_supported: int
    why: str = ""  # NOTHING_RUN: the refusals summarised; BROKEN: the load error

    def line(self) -> str:
        counts = f"{self.run} run, {self.passed} passed, {self.not_supported} not supported"
        why = f": {self.why}" if self.why else ""
        return f"{self.platform}: {self.state} ({counts}){why}"


def platform_verdict(
    results: list[Result], platform: str, accept_known_failures: bool = False
) -> PlatformVerdict:
    rows = [r for r in results if r.platform == platform]
    ran = [r for r in rows if r.impl]
    passed = sum(r.status in {Status.PASS, Status.QUALITY_WARNING} for r in ran)
    refused = [r for r in rows if r.status == Status.NOT_SUPPORTED and not r.impl]
    counts = (len(ran), passed, len(refused))
    broken = [r for r in rows if r.op == PLUGIN_OP]
    if broken:
        return PlatformVerdict(platform, BROKEN, *counts, why=broken[0].reason)
    allowed = CONFORMANT | ({Status.KNOWN_FAILURE} if accept_known_failures else set())
    if not all(r.status in allowed for r in rows if r.must_pass):
        return PlatformVerdict(platform, DOES_NOT_CONFORM, *counts)
    if not ran:
        return PlatformVerdict(platform, NOTHING_RUN, *counts, why=summarise_refusals(refused))
    return PlatformVerdict(platform, CONFORMS, *counts)


def summarise_refusals(rows: list[Result], most: int = 2) -> str:
    """The most common reasons cases were refused, with counts, then the ops not implemented."""
    reasons: Counter[str] = Counter()
    missing: list[str] = []
    for row in rows:
        if row.kind == UNCOVERED:
            continue
        if not row.refusals:
            if row.op not in missing:
                missing.append(row.op)
            continue
        reasons.update({f"{impl}: {reason}" for impl, reason in row.refusals})
    parts = [f"{reason} ({count} cases)" for reason, count in reasons.most_common(most)]
    if len(reasons) > most:
        parts.append(f"{len(reasons) - most} other reasons")
    if missing:
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        shown = ", ".join(missing[:4]) + more
        parts.append(f"no impl of {shown}")
    return "; ".join(parts) or "no case selected"
