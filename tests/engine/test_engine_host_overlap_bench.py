"""bench/engine_host_overlap.py runs on the CPU: both scheduling modes serve every request
through the emulated device (its timings are the bench's to report, not this test's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import engine_host_overlap


def test_both_modes_run_through_the_emulated_device(tmp_path):
    out = tmp_path / "rows.json"
    flags = ["--device-ms", "0.5", "--requests", "4", "--input-len", "16", "--output-len", "6"]
    rows = engine_host_overlap.main([*flags, "--json", str(out)])
    assert out.exists()
    assert [row["async_scheduling"] for row in rows] == [False, True]
    for row in rows:
        # at least a prefill step and five decode steps (the prefill samples each request's
        # first token); more when the requests reach the engine thread in several steps
        assert row["steps"] >= 6, row
        assert row["step_ms"] > 0 and row["tpot_ms_p50"] > 0
