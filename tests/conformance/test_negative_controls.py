"""Negative controls: a deliberately wrong platform must fail exactly where it is wrong.

One run of `hwrun conformance --platform wrong` (tests/conformance/plugins/hwrun_wrong_platform.py)
covers: an off-by-one top-k, a raising kernel, doubled logits (KNOWN_FAILURE through an entry
file), a base-2 LSE, a kernel that hangs on one case, one that SIGKILLs its process on one case, a
batch-variant router that claims batch invariance, and a correct op that is not claimed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hwrun.cli import cli

PLUGIN_DIR = Path(__file__).parent / "plugins"
TOPK_CASES = ("random", "relu_ties", "short_rows", "inf_nan", "batch1", "long_rows")
LSE_CASES = ("dcp2_fp32", "dcp4_bf16_h10", "far_lses", "batch1", "rows_640")
RAGGED_CASES = (
    "bf16_h4_ties",
    "fp8_h4_ties",
    "fp8_h20",
    "fp8_batch1",
    "fp8_tiles",
    "mxfp4_h4_ties",
    "mxfp4_h20",
    "mxfp4_tiles",
)


@pytest.fixture(scope="module")
def wrong_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    tmp = tmp_path_factory.mktemp("wrong")
    known = tmp / "known.toml"
    known.write_text(
        '[[known_failure]]\nplatform = "wrong"\nop = "indexer.logits_ragged"\n'
        'case = "*"\nreason = "scores doubled (tracking: hwrun#0)"\n'
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HWRUN_PLUGINS", "hwrun_wrong_platform")
        mp.setenv(
            "PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])
        )
        mp.syspath_prepend(str(PLUGIN_DIR))
        result = CliRunner().invoke(
            cli,
            [
                "conformance",
                "--platform",
                "wrong",
                "--quick",
                "--timeout",
                "5",  # the hanging kernel costs this twice; real quick cases take < 2 s
                "--report",
                str(tmp / "report"),
                "--known-failures",
                str(known),
            ],
        )
    rows = [
        json.loads(line) for line in (tmp / "report" / "results.jsonl").read_text().splitlines()
    ]
    by_case = {(r["op"], r["case"]): r for r in rows}
    return result.exit_code, by_case, result.output


def _status(by_case: dict, op: str, case: str) -> str:
    return by_case[(op, case)]["status"]


def test_exit_code_is_one(wrong_run) -> None:
    code, _, output = wrong_run
    assert code == 1, output


def test_off_by_one_topk_fails_accuracy_and_its_rows_alone(wrong_run) -> None:
    _, by_case, _ = wrong_run
    for name in TOPK_CASES:
        row = by_case[("indexer.topk", name)]
        assert row["status"] == "FAIL", row
        assert row["metric"] == "indices:index_set"
        assert _status(by_case, "indexer.topk", f"{name}.padding") == "PASS"
        if name != "batch1":
            # The rows run alone are checked against the reference first: wrong is FAIL.
            batch = by_case[("indexer.topk", f"{name}.batch")]
            assert batch["status"] == "FAIL" and "run alone (batch 1)" in batch["reason"], batch


def test_raising_kernel_fails_with_its_exception(wrong_run) -> None:
    _, by_case, _ = wrong_run
    rows = [r for (op, _), r in by_case.items() if op == "indexer.to_slots"]
    assert rows and all(r["status"] == "FAIL" for r in rows)
    assert all("RuntimeError: kernel launch failed" in r["reason"] for r in rows)


def test_known_failure_entry_names_the_reason(wrong_run) -> None:
    _, by_case, _ = wrong_run
    for name in RAGGED_CASES:
        row = by_case[("indexer.logits_ragged", name)]
        assert row["status"] == "KNOWN_FAILURE", row
        assert row["reason"].startswith("scores doubled (tracking: hwrun#0)")
        assert "calc_diff" in row["reason"]


def test_log2_lse_fails_on_the_lse_output(wrong_run) -> None:
    _, by_case, _ = wrong_run
    for name in LSE_CASES:
        row = by_case[("attn.lse_combine", name)]
        assert row["status"] == "FAIL" and row["metric"].startswith("lse:"), row
        assert _status(by_case, "attn.lse_combine", f"{name}.padding") == "PASS"


def test_hang_is_a_timeout_and_the_run_goes_on(wrong_run) -> None:
    _, by_case, _ = wrong_run
    assert _status(by_case, "kda.step", "decode") == "TIMEOUT"
    assert _status(by_case, "kda.step", "decode.batch") == "TIMEOUT"
    for name in ("no_state_gqa", "no_state_gqa.batch", "bf16_h6", "bf16_h6.batch"):
        assert _status(by_case, "kda.step", name) == "PASS"


def test_self_kill_is_a_crash_and_batch_variance_fails_the_claim(wrong_run) -> None:
    _, by_case, _ = wrong_run
    crash = by_case[("moe.route", "no_tokens")]
    assert crash["status"] == "CRASH" and "SIGKILL" in crash["reason"]
    for name in ("softmax_top2", "deepseek_grouped", "bf16_no_renorm"):
        assert _status(by_case, "moe.route", name) == "PASS"
        batch = by_case[("moe.route", f"{name}.batch")]
        assert batch["status"] == "FAIL" and batch["metric"] == "batch_invariance", batch
    assert by_case[("capabilities", "batch_invariant:moe.route")]["status"] == "FAIL"
    assert by_case[("capabilities", "batch_invariant:kda.chunk")]["status"] == "PASS"


def test_correct_op_passes_and_audit_reports_claims(wrong_run) -> None:
    _, by_case, _ = wrong_run
    chunk = [r for (op, _), r in by_case.items() if op == "kda.chunk"]
    assert chunk and all(r["status"] == "PASS" for r in chunk)
    unclaimed = by_case[("capabilities", "ops:kda.chunk")]
    assert unclaimed["status"] == "PASS" and "not claimed" in unclaimed["reason"]
    assert by_case[("capabilities", "ops:indexer.nonexistent")]["status"] == "FAIL"
    assert by_case[("capabilities", "ops:indexer.topk")]["status"] == "FAIL"


def test_swapped_mxfp4_nibbles_fail_only_the_mxfp4_writes(wrong_run) -> None:
    _, by_case, _ = wrong_run
    for name in ("small", "extreme", "batch1"):
        row = by_case[("kv.write_index_keys", f"mxfp4_{name}")]
        assert row["status"] == "FAIL" and row["metric"] == "cache:exact", row
        for fmt in ("bf16", "fp8"):
            assert _status(by_case, "kv.write_index_keys", f"{fmt}_{name}") == "PASS"


def test_write_past_the_cache_trips_the_guard_bytes(wrong_run) -> None:
    _, by_case, _ = wrong_run
    rows = [r for (op, c), r in by_case.items() if op == "kv.write_latent" and "." not in c]
    assert rows and all(r["status"] == "FAIL" for r in rows)
    assert all(r["metric"] == "guard_bytes" and "after" in r["reason"] for r in rows)


def test_exactly_the_broken_cases_do_not_pass(wrong_run) -> None:
    _, by_case, _ = wrong_run
    broken = {
        k: r["status"] for k, r in by_case.items() if r["status"] not in {"PASS", "NOT_SUPPORTED"}
    }
    expected = {
        **{("indexer.topk", n): "FAIL" for n in TOPK_CASES},
        **{("indexer.topk", f"{n}.batch"): "FAIL" for n in TOPK_CASES if n != "batch1"},
        **{("indexer.to_slots", n): "FAIL" for n in ("decode", "mtp", "explicit_rows", "batch1")},
        **{("attn.lse_combine", n): "FAIL" for n in LSE_CASES},
        **{("attn.lse_combine", f"{n}.batch"): "FAIL" for n in LSE_CASES if n != "batch1"},
        ("kda.step", "decode"): "TIMEOUT",
        ("kda.step", "decode.batch"): "TIMEOUT",
        ("moe.route", "no_tokens"): "CRASH",
        **{
            ("moe.route", f"{n}.batch"): "FAIL"
            for n in ("softmax_top2", "deepseek_grouped", "bf16_no_renorm")
        },
        **{("kv.write_index_keys", f"mxfp4_{n}"): "FAIL" for n in ("small", "extreme", "batch1")},
        **{
            ("kv.write_latent", f"{fmt}_{n}"): "FAIL"
            for fmt in ("bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla")
            for n in ("small", "small.padding", "extreme", "batch1")
        },
        **{("indexer.logits_ragged", n): "KNOWN_FAILURE" for n in RAGGED_CASES},
        **{
            ("indexer.logits_ragged", f"{n}.batch"): "KNOWN_FAILURE"
            for n in ("fp8_h4_ties", "fp8_h20", "fp8_tiles")
        },
        **{
            ("capabilities", item): "FAIL"
            for item in (
                "ops:indexer.topk",
                "ops:attn.lse_combine",
                "ops:moe.route",
                "ops:indexer.nonexistent",
                "batch_invariant:moe.route",
                "batch_invariant:kda.step",  # claimed, and its batch case timed out
                "batch_invariant:indexer.topk",  # claimed; its rows alone are wrong
                "batch_invariant:attn.lse_combine",
            )
        },
    }
    assert broken == expected


def test_report_rows_carry_the_required_fields(wrong_run) -> None:
    _, by_case, _ = wrong_run
    required = {"platform", "op", "case", "status", "metric", "value", "threshold", "seed", "impl"}
    for row in by_case.values():
        assert required <= set(row)
