"""The TPU plugin's Pallas kernels pass the quick conformance suite on the CPU, in Pallas's
interpret mode (HWRUN_PALLAS_INTERPRET=1, inherited by the worker process), serving fp8 index
keys and both latent formats themselves, and the plugin claims exactly what they serve."""

from __future__ import annotations

import pytest

from hwrun.plugins import load_plugins
from hwrun_conformance.runner import Result, RunOptions, conformant, run
from hwrun_conformance.status import CONFORMANT, Status

PALLAS_OPS = {
    "kv.write_latent",
    "kv.write_index_keys",
    "indexer.logits_paged",
    "indexer.logits_ragged",
    "indexer.topk",
    "sparse_mla.decode",
    "sparse_mla.prefill",
    "attn.lse_combine",
}
# (op, format): the formats the issue asks the kernels to serve, each in at least one case.
SERVED_FORMATS = {
    ("kv.write_index_keys", "fp8"),
    ("indexer.logits_paged", "fp8"),
    ("indexer.logits_ragged", "fp8"),
    ("kv.write_latent", "fp8_ds_mla"),
    ("kv.write_latent", "bf16"),
    ("sparse_mla.decode", "fp8_ds_mla"),
    ("sparse_mla.decode", "bf16"),
}


@pytest.fixture(scope="module")
def results() -> list[Result]:
    with pytest.MonkeyPatch.context() as env:
        # Only the TPU plugin, in this process and in the worker it starts.
        env.setenv("HWRUN_DISABLE_ENTRY_POINTS", "1")
        env.setenv("HWRUN_PLUGINS", "hwrun_tpu.plugin")
        env.setenv("HWRUN_PALLAS_INTERPRET", "1")
        return run(load_plugins(), ["tpu"], RunOptions(quick=True))


def test_quick_suite_is_conformant(results: list[Result]) -> None:
    bad = [
        (r.op, r.case, r.status, r.reason)
        for r in results
        if r.must_pass and r.status not in CONFORMANT
    ]
    assert conformant(results, "tpu"), bad


def test_the_pallas_impls_serve_every_case_of_their_formats(results: list[Result]) -> None:
    rows = [r for r in results if r.op in PALLAS_OPS]
    served = {r.op for r in rows if r.impl == "pallas" and r.status == Status.PASS}
    assert served == PALLAS_OPS
    # Not falling back: every case of these ops either ran on the Pallas impl and passed, or
    # was refused for its format (the formats the kernels leave out), never for the CPU.
    for r in rows:
        if r.status == Status.NOT_SUPPORTED:
            assert "format(s)" in r.reason and "HWRUN_PALLAS_INTERPRET" not in r.reason, r
        else:
            assert (r.impl, r.status) == ("pallas", Status.PASS), r
    for op, fmt in SERVED_FORMATS:
        cases = [r for r in rows if r.op == op and fmt in r.formats]
        assert cases and all(r.impl == "pallas" for r in cases), (op, fmt)


def test_claims_hold_and_are_complete(results: list[Result]) -> None:
    audit = [r for r in results if r.op == "capabilities"]
    assert audit and all(r.status == Status.PASS for r in audit), audit
    assert not [r.case for r in audit if "not claimed" in r.reason]
    claimed_ops = {r.case.removeprefix("ops:") for r in audit if r.case.startswith("ops:")}
    assert claimed_ops == PALLAS_OPS
