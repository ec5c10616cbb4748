"""`hwrun conformance` over the installed platforms: the reference passes every case, the
vendor platforms (no ops registered on this CPU machine) report NOT_SUPPORTED honestly."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from hwrun.cli import cli


@pytest.fixture(scope="module")
def all_quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict], Path]:
    report = tmp_path_factory.mktemp("all") / "report"
    with pytest.MonkeyPatch.context() as env:
        # Without Triton's interpreter the vendor platforms' Triton tier refuses CPU tensors;
        # the interpreter path is tests/conformance/test_triton_tier.py.
        env.delenv("TRITON_INTERPRET", raising=False)
        result = CliRunner().invoke(
            cli,
            ["conformance", "--platform", "all", "--quick", "--report", str(report)],
        )
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    return result.exit_code, rows, report


def test_every_platform_conforms(all_quick) -> None:
    code, rows, report = all_quick
    assert code == 0, (report / "summary.md").read_text()
    assert {r["platform"] for r in rows} >= {"reference", "nvidia", "amd", "tpu", "ppu"}


def test_reference_passes_every_case_it_runs(all_quick) -> None:
    _, rows, _ = all_quick
    reference = [r for r in rows if r["platform"] == "reference" and r["case"] != "-"]
    assert reference and all(r["status"] == "PASS" for r in reference), [
        r for r in reference if r["status"] != "PASS"
    ]
    assert all(r["impl"] == "reference" for r in reference if r["op"] != "capabilities")


def test_vendor_platforms_without_ops_say_why(all_quick) -> None:
    _, rows, _ = all_quick
    nvidia = [r for r in rows if r["platform"] == "nvidia"]
    assert nvidia and all(r["status"] == "NOT_SUPPORTED" for r in nvidia)
    assert all(r["reason"] for r in nvidia)


def test_reports_are_written(all_quick) -> None:
    _, rows, report = all_quick
    summary = (report / "summary.md").read_text()
    assert "| op | reference |" in summary and "conformant" in summary
    suites = ET.parse(report / "junit.xml").getroot().findall("testsuite")
    assert sum(int(s.get("tests")) for s in suites) == len(rows)


@pytest.mark.parametrize(
    "args",
    [["--platform", "no-such-platform"], ["--ops", "nothing.*"], ["--timeout", "0"]],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["conformance", *args])
    assert result.exit_code == 2, result.output
