"""The same cases under pytest: `pytest -p hwrun_conformance.pytest_plugin --pyargs ...`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLUGIN_DIR = Path(__file__).parent / "plugins"


def _pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs"]
    command += ["-p", "hwrun_conformance.pytest_plugin", "--pyargs", "hwrun_conformance", *args]
    return subprocess.run(
        command, cwd=tmp_path, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )


def test_reference_cases_pass_under_pytest(tmp_path: Path) -> None:
    run = _pytest(
        tmp_path, "--hwrun-platform", "reference", "--hwrun-ops", "attn.*", "--hwrun-quick"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "10 passed" in run.stdout  # 9 attn.lse_combine cases + the capability audit


def test_wrong_platform_fails_exactly_its_wrong_cases(tmp_path: Path) -> None:
    env = {
        "HWRUN_PLUGINS": "hwrun_wrong_platform",
        "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    run = _pytest(
        tmp_path,
        "--hwrun-platform",
        "wrong",
        "--hwrun-ops",
        "indexer.topk",
        "--hwrun-quick",
        env=env,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    failed = sorted(
        line.split("::", 1)[1].split(" ")[0]
        for line in run.stdout.splitlines()
        if line.startswith("FAILED")
    )
    expected = [
        f"test_case[wrong:indexer.topk/{n}[broken]]"
        for n in ("inf_nan", "random", "relu_ties", "short_rows")
    ]
    assert failed == sorted([*expected, "test_capabilities[wrong]"]), run.stdout
