"""The same cases under pytest: `pytest -p hwrun_conformance.pytest_plugin --pyargs ...`.

Run in-process (``pytest.main``) to spare a torch import; the cases still run in the worker.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).parent / "plugins"


def _pytest(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    """Run the inner session from the current directory (a tmp dir: no ini file there)."""
    code = pytest.main(
        [
            "-q",
            "-p",
            "no:cacheprovider",
            "-rfs",
            "-p",
            "hwrun_conformance.pytest_plugin",
            "--pyargs",
            "hwrun_conformance",
            *args,
        ]
    )
    return int(code), capsys.readouterr().out


def test_reference_cases_pass_under_pytest(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _pytest(
        capsys, "--hwrun-platform", "reference", "--hwrun-ops", "attn.*", "--hwrun-quick"
    )
    assert code == 0, out
    assert "15 passed" in out  # 14 attn.lse_combine cases + the capability audit


def test_wrong_platform_fails_exactly_its_wrong_cases(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HWRUN_PLUGINS", "hwrun_wrong_platform")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    code, out = _pytest(
        capsys,
        "--hwrun-platform",
        "wrong",
        "--hwrun-ops",
        "indexer.topk",
        "--hwrun-quick",
    )
    assert code == 1, out
    failed = sorted(
        line.split("::", 1)[1].split(" ")[0]
        for line in out.splitlines()
        if line.startswith("FAILED")
    )
    names = ("inf_nan", "random", "relu_ties", "short_rows", "long_rows")
    expected = [
        f"test_case[wrong:indexer.topk/{n}[broken]]"
        for n in (*names, *(f"{n}.batch" for n in names), "batch1")
    ]
    assert failed == sorted([*expected, "test_capabilities[wrong]"]), out
