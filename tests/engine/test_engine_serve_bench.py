"""bench/engine_serve.py runs end to end on the CPU with the embedded model: every request
generates exactly its tokens, and the report's figures are consistent with each other."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import engine_serve


@pytest.mark.parametrize("scheduling", [[], ["--async-scheduling"]], ids=["sync", "async"])
def test_engine_serve_bench_on_the_default_model(tmp_path, scheduling):
    out = tmp_path / "rows.json"
    rows = engine_serve.main(
        [
            "--platform", "reference", "--kv-cache-dtype", "bf16", "--index-dtype", "bf16",
            "--input-len", "24", "--output-len", "5", "--requests", "6",
            "--rate", "inf", "200", "--concurrency", "3", "--step-clock", "--json", str(out),
            *scheduling,
        ]
    )  # fmt: skip
    assert out.exists() and len(rows) == 2
    for row in rows:
        assert row["requests"] == 6 and row["concurrency"] == 3
        assert 0 < row["mean_in_flight"] <= 3
        assert row["output_tokens_per_s"] > 0
        assert math.isclose(row["output_tokens_per_s"], 6 * 5 / row["duration_s"], rel_tol=1e-9)
        for name in ("ttft_ms", "tpot_ms"):
            assert 0 < row[f"{name}_p50"] <= row[f"{name}_p90"] <= row[f"{name}_p99"]
        assert "decode_roofline_ms" not in row  # CPU: no measured copy bandwidth
        # 6 prompts of 24 tokens, at most 3 requests at once: at least 2 steps with prefill
        # chunks, and 6 x 4 decode tokens (the first comes from the prefill) at most 3 a step.
        # A step counts as "prefill" when any of its chunks is one, and under load the
        # scheduler can put decode rows beside a newly arrived prompt (CI, 2026-12-04: 4
        # prefill and 7 decode steps), so the decode tokens' bound is over both kinds.
        assert row["prefill_steps"] >= 2 and row["decode_steps"] >= 1
        assert row["prefill_steps"] + row["decode_steps"] >= 6 * 4 / 3
        for kind in ("decode", "prefill"):
            parts = row[f"{kind}_runner_host_ms"] + row[f"{kind}_device_wait_ms"]
            assert 0 < parts <= row[f"{kind}_step_ms"]
