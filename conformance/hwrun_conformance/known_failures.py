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
    """Entries of a TOML file; a ValueError names the file and what is wrong with it (not TOML,
    not readable, or which entry lacks or mistypes which field)."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot be read: {err}") from err
    raw_entries = data.get("known_failure", [])
    if not isinstance(raw_entries, list):
        raise ValueError(
            f"{path}: 'known_failure' must be an array of tables ([[known_failure]]), "
            f"got {type(raw_entries).__name__}"
        )
    unknown = sorted(set(data) - {"known_failure"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {unknown}; only [[known_failure]]")
    entries = []
    for index, raw in enumerate(raw_entries):
        fields = ("platform", "op", "case", "reason")
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: known_failure entry {index} is not a table")
        missing = [key for key in fields if not raw.get(key)]
        if missing:
            raise ValueError(
                f"{path}: known_failure entry {index} lacks {missing}; every entry needs "
                "platform, op, case and a non-empty reason"
            )
        mistyped = [key for key in fields if not isinstance(raw[key], str)]
        extra = sorted(set(raw) - set(fields))
        if mistyped or extra:
            problem = f"non-string {mistyped}" if mistyped else f"unknown keys {extra}"
            raise ValueError(f"{path}: known_failure entry {index} has {problem}")
        entries.append(KnownFailure(raw["platform"], raw["op"], raw["case"], raw["reason"]))
    return tuple(entries)


def find_known_failure(
    entries: tuple[KnownFailure, ...], platform: str, op: str, case: str
) -> KnownFailure | None:
    return next((e for e in entries if e.matches(platform, op, case)), None)
