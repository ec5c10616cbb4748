"""The minimal plugin of docs/plugin-guide.md, copied as written, under the conformance suite:
on this machine (no NPU) the suite says "nothing run here" with the impl's own reason, never
"conformant"; its kernel passes every top-k case, which is what runs where its NPU is."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from hwrun.cli import cli
from hwrun.ops.catalogue import catalogue
from hwrun_conformance.case import ACCURACY
from hwrun_conformance.cases import all_cases
from hwrun_conformance.execute import run_case


@pytest.fixture
def guide_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from foundation.test_plugin_guide import minimal_plugin_source

    (tmp_path / "hwrun_guide_example.py").write_text(minimal_plugin_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "hwrun_guide_example"


def test_without_its_device_nothing_runs_and_the_suite_says_why(guide_plugin: str) -> None:
    env = {"HWRUN_DISABLE_ENTRY_POINTS": "1", "HWRUN_PLUGINS": guide_plugin}
    args = ["conformance", "--platform", "myvendor", "--ops", "indexer.topk", "--quick"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 1, result.output
    assert "myvendor: nothing run here (0 run, 0 passed, 17 not supported): npu-radix: " in (
        result.output
    )
    assert "tensors must be on the NPU, got 'cpu' (17 cases)" in result.output


def test_its_kernel_passes_every_top_k_case(guide_plugin: str) -> None:
    example = importlib.import_module(guide_plugin)
    cases = [c for c in all_cases(catalogue())["indexer.topk"] if c.kind == ACCURACY]
    assert any(c.name == "k2048_64k" for c in cases)
    reference = catalogue()["indexer.topk"].reference
    for case in cases:
        verdict = run_case(case, example.my_topk, reference, platform="myvendor")
        assert verdict.passed, (case.name, verdict)
