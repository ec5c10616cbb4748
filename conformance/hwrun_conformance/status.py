"""Result codes of a conformance case, and which of them leave a platform conformant."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PASS = "PASS"  # the impl matches the reference within the case's tolerance
    FAIL = "FAIL"  # wrong result, raised, touched guard bytes, or a claim it does not keep
    NOT_SUPPORTED = "NOT_SUPPORTED"  # no impl of the platform accepts the case (reasons given)
    QUALITY_WARNING = "QUALITY_WARNING"  # an advisory (not must-pass) check missed its tolerance
    KNOWN_FAILURE = "KNOWN_FAILURE"  # failed, and a known-failure entry names why
    CRASH = "CRASH"  # the process running the case died
    TIMEOUT = "TIMEOUT"  # the case ran past --timeout and its process was killed


CONFORMANT = frozenset({Status.PASS, Status.NOT_SUPPORTED, Status.QUALITY_WARNING})
"""A platform conforms when every must-pass case ends in one of these."""

BROKEN = frozenset({Status.FAIL, Status.CRASH, Status.TIMEOUT})
"""Statuses a known-failure entry may turn into KNOWN_FAILURE."""

DEFAULT_TIMEOUT_S = 120.0
"""Seconds one case may run before its worker is killed and the case is TIMEOUT."""

INTERPRETER_TIMEOUT_S = 600.0
"""The default under Triton's CPU interpreter (TRITON_INTERPRET=1), which pays tens of
milliseconds per program: the full run's large batches (4100 top-k rows) take minutes there."""
