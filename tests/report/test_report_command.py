"""`hwrun report` as a user runs it: the three files, usage errors, and the checked-in support
matrix is what `--merge` produces from the checked-in results."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, RESULTS, write_plugin

from hwrun.cli import cli
from hwrun.ops import catalogue
from hwrun.report import MERGE_SCHEMA, REPORT_SCHEMA


def _invoke(*args: str):
    return CliRunner().invoke(cli, ["report", *args], catch_exceptions=False)


def test_report_writes_html_md_and_json(tmp_path):
    done = _invoke(
        "--platform", "all",
        "--conformance", str(RESULTS / "reference-cpu" / "results.jsonl"),
        "--bench", str(RESULTS / "nvidia-h200" / "bench" / "engine_decode.json"),
        "--models", "deepseek-v3.2",
        "--kv-budget", "50e9",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json", "report.md"]
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schema"] == REPORT_SCHEMA
    assert [row["op"] for row in data["ops"]] == list(catalogue())
    assert {p["name"] for p in data["platforms"]} >= {"reference", "nvidia", "amd", "tpu", "ppu"}
    (capacity,) = data["capacity"]
    assert capacity["model"] == "deepseek-v3.2" and capacity["kv_budget_per_gpu"] == 50 * 10**9
    assert data["bench"][0]["commit"] == "3f528bf"
    markdown = (tmp_path / "report.md").read_text()
    for title in ("## Platforms", "## Op x platform", "## Formats", "## Conformance results",
                  "## Capacity: deepseek-v3.2", "## Benchmarks"):  # fmt: skip
        assert title in markdown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "pdf"), "formats are a comma-separated subset of html, md, json"),
        (("--quick",), "--quick applies to --run-conformance only"),
        (("--merge",), "--merge needs the results.jsonl files"),
        (("x.jsonl",), "results files as arguments need --merge"),
        (("--merge", "--format", "html", "x.jsonl"), "--merge writes md and json"),
        (("--models", "no-such-model"), "unknown model 'no-such-model'"),
        (("--platform", "nope"), "unknown platform 'nope'; loaded platforms: reference"),
    ],
)
def test_usage_errors_say_what_to_change(tmp_path, args, message):
    done = CliRunner().invoke(cli, ["report", "--out", str(tmp_path), *args])
    assert done.exit_code == 2, done.output
    assert message in done.output


def test_a_missing_results_file_is_a_usage_error(tmp_path, monkeypatch):
    import hwrun.cli

    monkeypatch.setattr("sys.argv", ["hwrun", "report", "--conformance", "nope.jsonl",
                                     "--out", str(tmp_path)])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        hwrun.cli.main()
    assert exited.value.code == 2


def test_merging_two_machines_keeps_each_ones_device_and_date(tmp_path):
    for name, device, date in (
        ("h200", "cuda: 1 x NVIDIA H200 (sm_90, 140 GiB)", "2026-12-01T00:00:03+00:00"),
        ("laptop", "cpu", "2026-11-30T12:00:00+00:00"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        row = {"platform": "nvidia", "op": "indexer.topk", "case": "a", "status": "PASS"}
        (folder / "results.jsonl").write_text(json.dumps(row) + "\n")
        run = {"date": date, "commit": name, "devices": {"nvidia": device},
               "triton_interpret": name == "laptop", "mode": "quick"}  # fmt: skip
        (folder / "run.json").write_text(json.dumps(run))
    files = [str(tmp_path / n / "results.jsonl") for n in ("h200", "laptop")]
    done = _invoke("--merge", *files, "--format", "md,json", "--out", str(tmp_path / "out"))
    assert done.exit_code == 0, done.output
    data = json.loads((tmp_path / "out" / "support-matrix.json").read_text())
    assert data["schema"] == MERGE_SCHEMA
    runs = [(r["platform"], r["device"], r["date"], r["on_hardware"]) for r in data["runs"]]
    assert runs == [
        ("nvidia", "cuda: 1 x NVIDIA H200 (sm_90, 140 GiB)", "2026-12-01T00:00:03+00:00", True),
        ("nvidia", "cpu (Triton interpreter)", "2026-11-30T12:00:00+00:00", False),
    ]
    markdown = (tmp_path / "out" / "support-matrix.md").read_text()
    assert "| op | nvidia #1 | nvidia #2 |" in markdown
    assert "| `indexer.topk` | PASS 1 | PASS 1 |" in markdown


def test_the_checked_in_support_matrix_is_what_the_command_produces(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    files = sorted(str(p.relative_to(REPO)) for p in RESULTS.glob("*/results.jsonl"))
    assert len(files) >= 4  # CPU reference, nvidia and amd in the interpreter, the H200
    done = _invoke("--merge", *files, "--format", "md", "--out", str(tmp_path))
    assert done.exit_code == 0, done.output
    produced = (tmp_path / "support-matrix.md").read_text()
    checked_in = Path(REPO / "docs" / "support-matrix.md").read_text()
    assert produced == checked_in, (
        "docs/support-matrix.md is stale: run `hwrun report --merge docs/results/*/results.jsonl "
        "--format md --out docs` and commit it"
    )


def test_run_conformance_runs_the_suite_first_and_shows_its_results(tmp_path):
    """The one thing the report runs: `hwrun conformance` in a subprocess, its reports kept
    under --out; a platform that runs nothing there is not conformant (exit 1), and the report
    still shows its rows."""
    write_plugin(tmp_path, "hwrun_report_run")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HWRUN_PLUGINS": "hwrun_report_run"}
    out = tmp_path / "out"
    command = [sys.executable, "-c", "from hwrun.cli import main; main()", "report",
               "--platform", "hwrun_report_run", "--run-conformance", "--quick",
               "--models", "deepseek-v3.2", "--format", "json", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "conformance" / "run.json").is_file()
    data = json.loads((out / "report.json").read_text())
    (source,) = data["conformance"]
    assert source["mode"] == "quick" and source["platforms"]["hwrun_report_run"].startswith("cpu")
    topk = next(row for row in data["ops"] if row["op"] == "indexer.topk")
    cell = topk["platforms"]["hwrun_report_run"]
    assert cell["tier"] == "reference fallback" and cell["state"] == "not supported"
    assert cell["conformance"][0]["counts"]["NOT_SUPPORTED"] > 0
