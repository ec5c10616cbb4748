"""What a report says about the run itself: versions, commit, date, host, devices, mode.

A conformance report is evidence; without the hwrun and plugin versions, the device and whether
Triton's interpreter stood in for a GPU, a reader cannot tell what it proves.
"""

from __future__ import annotations

import contextlib
import platform as host_platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwrun import API_VERSION, __version__, knobs

if TYPE_CHECKING:
    from hwrun.plugins import PluginSet
    from hwrun_conformance.runner import Plan, RunOptions


def run_metadata(
    plugins: PluginSet,
    options: RunOptions,
    plans: dict[str, Plan],
    mode: str,
    fuzz: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The run's facts as plain JSON data (``mode``: "quick", "full" or "fuzz")."""
    import torch

    return {
        "hwrun": __version__,
        "hook_api": API_VERSION,
        "commit": source_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": host_platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": _version_of("triton"),
        "triton_interpret": knobs.triton_interpret(),
        "mode": mode,
        **({"fuzz": fuzz} if fuzz else {}),
        "ops": options.ops,
        "timeout_s": options.timeout,
        "plugins": {
            p.name: {"version": p.version, "status": p.status, "module": p.module}
            for p in plugins.plugins
        },
        "devices": {
            name: (plan.target.describe() if plan.target is not None else "unknown")
            for name, plan in plans.items()
        },
        "interrupted": False,
    }


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


def _version_of(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # absent or broken: the report says so by null
        return None


def describe(metadata: dict[str, Any]) -> list[str]:
    """Markdown list items for summary.md."""
    plugins = ", ".join(
        f"{name} {info['version'] or '?'}"
        + ("" if info["status"] == "loaded" else f" ({info['status']})")
        for name, info in metadata["plugins"].items()
    )
    devices = "; ".join(f"{name}: {where}" for name, where in metadata["devices"].items())
    mode = metadata["mode"]
    if "fuzz" in metadata:
        mode += f" ({metadata['fuzz']['count']} specs per op, seed {metadata['fuzz']['seed']})"
    lines = [
        f"- hwrun {metadata['hwrun']} (hook API {metadata['hook_api']}), "
        f"commit {metadata['commit'] or 'unknown'}",
        f"- {metadata['date']} on {metadata['host']}; python {metadata['python']}, "
        f"torch {metadata['torch']}, triton {metadata['triton'] or 'absent'}",
        f"- mode: {mode}; ops `{metadata['ops']}`; timeout {metadata['timeout_s']:g} s; "
        f"Triton interpreter {'on' if metadata['triton_interpret'] else 'off'}",
        f"- plugins: {plugins}",
        f"- devices: {devices or 'none'}",
    ]
    if metadata.get("interrupted"):
        lines.append("- **interrupted**: the run was stopped (SIGINT); these results are partial")
    return lines
