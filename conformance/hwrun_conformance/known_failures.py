"""Known failures: cases a platform is known to fail, each with the reason.

A matching FAIL, CRASH or TIMEOUT is reported as KNOWN_FAILURE with the entry's reason instead
of the raw status (it still does not conform unless the run accepts known failures). Entries live
in :data:`KNOWN_FAILURES` (reviewed like any code change) or in a vendor's TOML file passed with
``--known-failures``::

    [[known_failure]]
    platform = "amd"
    op = "sparse_mla.decode"       # glob
    case = "heads_*"               # glob over case names
    reason = "gfx942: ... (tracking issue URL)"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path


@dataclass(frozen=True)
class KnownFailure:
    platform: str
    op: str  # glob
    case: str  # glob over case names
    reason: str

    def matches(self, platform: str, op: str, case: str) -> bool:
        return (
            self.platform == platform and fnmatchcase(op, self.op) and fnmatchcase(case, self.case)
        )


KNOWN_FAILURES: tuple[KnownFailure, ...] = ()


def load_known_failures(path: Path) -> tuple[KnownFailure, ...]:
    """Entries of a TOML file; a ValueError names the file and the entry that is malformed."""
    with path.open("rb") as handle:
        data = tomllib.load(handle)
    entries = []
    for index, raw in enumerate(data.get("known_failure", [])):
        missing = [key for key in ("platform", "op", "case", "reason") if not raw.get(key)]
        if missing:
            raise ValueError(
                f"{path}: known_failure entry {index} lacks {missing}; every entry needs "
                "platform, op, case and a non-empty reason"
            )
        entries.append(KnownFailure(raw["platform"], raw["op"], raw["case"], raw["reason"]))
    return tuple(entries)


def find_known_failure(
    entries: tuple[KnownFailure, ...], platform: str, op: str, case: str
) -> KnownFailure | None:
    return next((e for e in entries if e.matches(platform, op, case)), None)
