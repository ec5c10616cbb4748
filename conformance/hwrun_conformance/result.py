"""A row of the conformance report, and the claim rule both the runner and the audit apply.

Its own module so that the runner (which makes rows) and the audit (which reads them and adds
its own) both import it, and neither imports the other's module.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from hwrun_conformance.status import Status

BATCH_FEATURE = "batch_invariant"
UNCOVERED = "uncovered"  # the kind of the row an op without cases gets


@dataclass(frozen=True)
class Result:
    """One row of the report: a case of an op on a platform, run by one impl (or by none)."""

    platform: str
    op: str
    case: str
    status: Status
    impl: str | None = None
    metric: str | None = None
    value: float | None = None
    threshold: float | None = None
    seed: int | None = None
    reason: str = ""
    must_pass: bool = True
    kind: str = "accuracy"
    relaxation: str | None = None
    seconds: float = 0.0
    about: str = ""
    formats: tuple[str, ...] = ()
    refusals: tuple[tuple[str, str], ...] = ()  # NOT_SUPPORTED: (impl, reason) per refusal


def claims_batch_invariance(features: frozenset[str], op: str) -> bool:
    """``batch_invariant`` claims it for every op; ``batch_invariant:GLOB`` for matching ops."""
    for feature in features:
        name, _, pattern = feature.partition(":")
        if name == BATCH_FEATURE and (not pattern or fnmatchcase(op, pattern)):
            return True
    return False
