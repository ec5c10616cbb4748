"""Negative controls of the kind real kernels fail: one platform per bug
(tests/conformance/plugins/hwrun_bug_*.py), each the reference with one bug in one place. The
suite must end the cases that reach the bug in FAIL (never NOT_SUPPORTED), naming the case, and
pass the others.

One full run of `hwrun conformance --platform all` over top-k and paged logits, with only the
reference and the five controls loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hwrun.cli import cli

PLUGIN_DIR = Path(__file__).parent / "plugins"
CONTROLS = ("batch1", "row1000", "rare_rows", "partial_block", "multi_tile")


@pytest.fixture(scope="module")
def bug_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict], str]:
    report = tmp_path_factory.mktemp("bugs") / "report"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HWRUN_DISABLE_ENTRY_POINTS", "1")
        mp.setenv("HWRUN_PLUGINS", ",".join(f"hwrun_bug_{name}" for name in CONTROLS))
        mp.setenv(
            "PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])
        )
        mp.syspath_prepend(str(PLUGIN_DIR))
        # indexer.topk and indexer.logits_paged, the controls' ops: the reference (always
        # loaded) runs only those.
        ops = "indexer.*p[ak]*"
        result = CliRunner().invoke(
            cli, ["conformance", "--platform", "all", "--ops", ops, "--report", str(report)]
        )
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    return result.exit_code, rows, result.output


def _ran(rows: list[dict], platform: str) -> dict[str, dict]:
    return {r["case"]: r for r in rows if r["platform"] == platform and r["impl"]}


def _failed(rows: list[dict], platform: str) -> set[str]:
    return {case for case, r in _ran(rows, platform).items() if r["status"] == "FAIL"}


def _assert_named(output: str, platform: str, op: str, cases: set[str]) -> None:
    for case in cases:
        assert f"FAIL {platform} {op} {case} [buggy]:" in output, (case, output[-3000:])


def test_every_control_fails_and_the_reference_passes(bug_run) -> None:
    code, rows, output = bug_run
    assert code == 1, output
    reference = [r for r in rows if r["platform"] == "reference" and r["impl"]]
    assert reference and all(r["status"] == "PASS" for r in reference)
    for platform in {r["platform"] for r in rows} - {"reference"}:
        ran = _ran(rows, platform).values()
        # Right answers whose bits vary with the batch are "not batch-invariant", nothing worse.
        varies = [r for r in ran if r["status"] == "NOT_SUPPORTED"]
        assert all("not batch-invariant (not claimed)" in r["reason"] for r in varies), varies
        assert all(r["status"] in {"PASS", "FAIL", "NOT_SUPPORTED"} for r in ran), platform
        assert _failed(rows, platform), platform


def test_wrong_only_at_batch_1(bug_run) -> None:
    _, rows, output = bug_run
    failed = _failed(rows, "bug-batch1")
    # The batch-1 case, and the .batch siblings: their rows run alone are checked against the
    # reference, so a wrong answer there is FAIL, not "not batch-invariant". (short_rows.batch
    # is not among them: its row alone has exactly k columns, and any order of them is right.)
    batch_siblings = {c for c in _ran(rows, "bug-batch1") if c.endswith(".batch")}
    assert failed == {"batch1"} | (batch_siblings - {"short_rows.batch"}), failed
    for case in failed - {"batch1"}:
        assert "run alone (batch 1)" in _ran(rows, "bug-batch1")[case]["reason"]
    _assert_named(output, "bug-batch1", "indexer.topk", failed)


def test_wrong_only_past_row_1000(bug_run) -> None:
    _, rows, output = bug_run
    failed = _failed(rows, "bug-row1000")
    assert failed == {"rows_4100"}, failed
    assert "row 1000:" in _ran(rows, "bug-row1000")["rows_4100"]["reason"]
    _assert_named(output, "bug-row1000", "indexer.topk", failed)


def test_wrong_in_rare_rows_picked_by_the_data(bug_run) -> None:
    _, rows, output = bug_run
    failed = _failed(rows, "bug-rare-rows")
    assert "rows_4100" in failed, failed
    # About 1 row in 1000 of the 4100: the per-row metric reports each one.
    assert _ran(rows, "bug-rare-rows")["rows_4100"]["value"] < 20
    _assert_named(output, "bug-rare-rows", "indexer.topk", failed)


def test_wrong_only_in_the_last_partial_block(bug_run) -> None:
    _, rows, output = bug_run
    failed = _failed(rows, "bug-partial-block")
    accuracy = {c for c in _ran(rows, "bug-partial-block") if not c.endswith(".padding")}
    assert failed == accuracy, accuracy - failed  # every case has partial last blocks
    assert {"fp8_batch1_blocks20", "fp8_block64_long"} <= failed
    _assert_named(output, "bug-partial-block", "indexer.logits_paged", failed)


def test_wrong_only_when_a_row_spans_several_tiles(bug_run) -> None:
    _, rows, output = bug_run
    failed = _failed(rows, "bug-multi-tile")
    assert {"batch1", "long_rows", "k2048_64k", "k2048_64k_ties"} <= failed, failed
    # Rows within one 4096-column tile are right.
    for case in ("random", "relu_ties", "short_rows", "inf_nan", "k2048", "rows_4100"):
        assert case not in failed
    _assert_named(output, "bug-multi-tile", "indexer.topk", failed)
