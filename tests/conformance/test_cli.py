"""`hwrun conformance` as a user meets it: usage errors that name the bad input, honest verdicts,
broken plugins in the results, run metadata, an 80-column table, SIGINT, the fuzz mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner
from rich.console import Console

from hwrun.cli import cli
from hwrun_conformance.report import summary_tables
from hwrun_conformance.result import Result
from hwrun_conformance.status import Status

PLUGIN_DIR = Path(__file__).parent / "plugins"


def _invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["conformance", *args], env=env)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_timeout_must_be_a_finite_positive_number(value: str) -> None:
    result = _invoke("--platform", "reference", "--timeout", value)
    assert result.exit_code == 2, result.output
    assert "--timeout" in result.output and "finite" in result.output


def test_bad_known_failures_toml_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "vendor-known.toml"
    bad.write_text('[[known_failure]]\nplatform = "amd"\nop = "sparse_mla.*\n')
    result = _invoke("--platform", "reference", "--known-failures", str(bad))
    assert result.exit_code == 2, result.output
    assert str(bad) in result.output.replace("\n", "") and "not valid TOML" in result.output
    mistyped = tmp_path / "mistyped.toml"
    mistyped.write_text('[[known_failure]]\nplatform="p"\nop="*"\ncase=3\nreason="why"\n')
    result = _invoke("--platform", "reference", "--known-failures", str(mistyped))
    assert result.exit_code == 2 and "non-string ['case']" in result.output


def test_unwritable_report_dir_is_refused_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    started = time.monotonic()
    result = _invoke("--platform", "reference", "--report", str(blocker / "report"))
    assert result.exit_code == 2, result.output
    assert "cannot write reports into" in result.output and "--report" in result.output
    assert time.monotonic() - started < 20  # refused up front: no case ran


def test_seed_needs_fuzz() -> None:
    result = _invoke("--platform", "reference", "--seed", "3")
    assert result.exit_code == 2 and "--seed applies to --fuzz" in result.output


def test_a_platform_that_ran_nothing_is_not_called_conformant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    report = tmp_path / "report"
    args = ("--platform", "bug-multi-tile", "--quick", "--ops", "attn.*", "--report", str(report))
    result = _invoke(*args, env=_bug_env("hwrun_bug_multi_tile"))  # it implements top-k only
    assert result.exit_code == 1, result.output  # named alone and nothing was checked
    line = (
        "bug-multi-tile: nothing run here (0 run, 0 passed, 14 not supported): "
        "no impl of attn.lse_combine"
    )
    assert line in result.output
    assert "conformant" not in result.output.replace("not conformant", "")
    summary = (report / "summary.md").read_text()
    assert "| **verdict** | nothing run here |" in summary


def test_report_carries_run_metadata(tmp_path: Path) -> None:
    report = tmp_path / "report"
    args = ("--platform", "reference", "--quick", "--ops", "attn.*", "--report", str(report))
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    assert "reference: conformant (14 run, 14 passed, 0 not supported)" in result.output
    run = json.loads((report / "run.json").read_text())
    assert run["mode"] == "quick" and run["ops"] == "attn.*" and run["interrupted"] is False
    assert run["devices"]["reference"].startswith("cpu")
    assert run["plugins"]["reference"]["status"] == "loaded"
    assert run["hwrun"] and run["torch"] and run["date"] and run["host"]
    assert run["commit"] is None or len(run["commit"].removesuffix("+dirty")) == 40
    assert isinstance(run["triton_interpret"], bool)
    summary = (report / "summary.md").read_text()
    assert "- mode: quick; ops `attn.*`" in summary
    properties = ET.parse(report / "junit.xml").getroot().find("properties")
    assert {p.get("name") for p in properties} >= {"hwrun", "commit", "mode", "devices"}


def test_console_tables_fit_80_columns_without_cutting() -> None:
    platforms = ("reference", "nvidia", "amd", "tpu", "ppu", "myvendor-npu")
    ops = ("indexer.logits_ragged", "kv.write_index_keys", "sparse_mla.prefill")
    statuses = (Status.TIMEOUT, Status.KNOWN_FAILURE, Status.PASS, Status.NOT_SUPPORTED)
    rows = [
        Result(p, op, f"c{i}", status)
        for p in platforms
        for op in ops
        for i, status in enumerate(statuses * 30)
    ]
    console = Console(width=80, record=True, color_system=None)
    tables = summary_tables(rows, width=80)
    assert len(tables) == 2  # six wide platform columns: split, never folded
    for table in tables:
        console.print(table)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    assert "…" not in text
    for name in (*platforms, *ops):
        assert f" {name} " in text, name  # whole on one line
    assert text.count("T/O 30/120") == len(platforms) * len(ops)


def _bug_env(*modules: str) -> dict[str, str]:
    return {
        "HWRUN_DISABLE_ENTRY_POINTS": "1",
        "HWRUN_PLUGINS": ",".join(modules),
        "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]),
    }


def test_fuzz_failures_print_seed_spec_and_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    env = _bug_env("hwrun_bug_multi_tile")
    args = ("--platform", "bug-multi-tile", "--ops", "indexer.topk", "--fuzz", "12")
    result = _invoke(*args, "--seed", "4", env=env)
    assert result.exit_code == 1, result.output
    assert "fuzz: 12 specs per op, seed 4" in result.output
    assert "FAIL bug-multi-tile indexer.topk fuzz4_" in result.output
    assert "seed 4, spec: *_topk('fuzz4_" in result.output
    assert "replay: hwrun conformance --platform bug-multi-tile --ops indexer.topk --fuzz 12 " in (
        result.output
    )
    again = _invoke(*args, "--seed", "4", env=env)
    fails = [line for line in result.output.splitlines() if line.startswith("FAIL ")]
    assert fails == [line for line in again.output.splitlines() if line.startswith("FAIL ")]


def test_fuzz_specs_are_seeded_and_replay_as_named_cases() -> None:
    import importlib

    import torch

    from hwrun.ops.catalogue import catalogue
    from hwrun_conformance.cases import fuzz_cases

    first = fuzz_cases(catalogue(), seed=9, count=3)
    assert set(first) == set(catalogue())  # every op has a fuzz domain
    assert {c.about for cases in first.values() for c in cases} == {
        c.about for cases in fuzz_cases(catalogue(), seed=9, count=3).values() for c in cases
    }
    assert first["indexer.topk"][0].about != fuzz_cases(catalogue(), 10, 1)["indexer.topk"][0].about
    for op, family in (("indexer.topk", "topk"), ("sparse_mla.decode", "sparse_mla")):
        module = importlib.import_module(f"hwrun_conformance.cases.{family}")
        for case in first[op]:
            replayed = eval(f"[{case.about}]", vars(module))[0]  # the printed spec, as written
            a, b = case.build(case.generator()), replayed.build(replayed.generator())
            for name, value in a.kwargs.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, b.kwargs[name]), (case.about, name)


def test_plugins_that_break_appear_as_broken_and_the_others_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.foundation.plugin_modules import faulty_plugin, write_plugin
    from tests.foundation.test_plugin_faults import FAULTS

    modules = [faulty_plugin(tmp_path, name, hooks) for name, (hooks, _) in FAULTS.items()]
    modules.append(write_plugin(tmp_path, "raise RuntimeError('libvendor.so not found')\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {
        "HWRUN_DISABLE_ENTRY_POINTS": "1",
        "HWRUN_PLUGINS": ",".join(modules),
        "PYTHONPATH": str(tmp_path),
    }
    report = tmp_path / "report"
    args = ("--platform", "all", "--quick", "--ops", "attn.*", "--report", str(report))
    result = _invoke(*args, env=env)
    assert result.exit_code == 1, result.output
    assert "reference: conformant (14 run, 14 passed" in result.output
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    broken = {r["platform"]: r for r in rows if r["op"] == "plugin"}
    for name, (_, reason) in FAULTS.items():
        assert broken[name]["status"] == "FAIL" and reason in broken[name]["reason"]
        assert f"{name}: broken (0 run, 0 passed, 0 not supported): broken: " in result.output
    assert "RuntimeError: libvendor.so not found" in result.output


def test_sigint_writes_the_partial_report_and_exits_130(tmp_path: Path) -> None:
    report = tmp_path / "report"
    marker = tmp_path / "hanging"
    env = {
        **os.environ,
        **_bug_env("hwrun_wrong_platform"),
        "HWRUN_TEST_HANG_MARKER": str(marker),
    }
    args = ["--platform", "wrong", "--ops", "kda.*", "--quick", "--report", str(report)]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from hwrun.cli import main; main()", "conformance", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), proc.communicate(timeout=30)[0]
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "interrupted: the results above and in the report are partial" in output
    assert json.loads((report / "run.json").read_text())["interrupted"] is True
    assert "**interrupted**" in (report / "summary.md").read_text()
