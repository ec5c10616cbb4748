"""Where a result came from: the git commit of the hwrun source tree that produced it.

Conformance reports (run.json), benchmark files and `hwrun report` all record it, from here.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path


def source_commit() -> str | None:
    """The git commit of the hwrun source tree when it is a checkout, with "+dirty" when tracked
    files differ from it (None for a wheel, or without git)."""
    import hwrun

    where = str(Path(hwrun.__file__).resolve().parent)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = _git(where, "rev-parse", "HEAD")
        if head.returncode == 0:
            changes = _git(where, "status", "--porcelain", "--untracked-files=no")
            dirty = changes.returncode == 0 and bool(changes.stdout.strip())
            return head.stdout.strip() + ("+dirty" if dirty else "")
    return None


def _git(where: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", where, *args], capture_output=True, text=True, timeout=10, check=False
    )
