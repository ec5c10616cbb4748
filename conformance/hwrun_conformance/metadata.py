"""What a report says about the run itself: versions, commit, date, host, devices, mode.

A conformance report is evidence; without the hwrun and plugin versions, the device and whether
Triton's interpreter stood in for a GPU, a reader cannot tell what it proves.
"""

from __future__ import annotations

import platform as host_platform
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hwrun import API_VERSION, __version__, knobs
from hwrun.provenance import source_commit

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
