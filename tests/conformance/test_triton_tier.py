"""The vendor plugins' portable Triton tier (NVIDIA, AMD, PPU) passes the quick conformance
suite on CPU, in Triton's interpreter (TRITON_INTERPRET=1, set for the test session on machines
without a GPU and inherited by the worker process), and the plugins claim exactly what it
serves: the PPU's W4A16 MoE (int4_g128) included."""

from __future__ import annotations

import pytest

from hwrun import knobs
from hwrun.plugins import load_plugins
from hwrun_conformance.runner import Result, RunOptions, conformant, run
from hwrun_conformance.status import CONFORMANT, Status

PLATFORMS = ("nvidia", "amd", "ppu")
TRITON_OPS = {
    "indexer.logits_paged",
    "indexer.logits_ragged",
    "indexer.topk",
    "indexer.to_slots",
    "sparse_mla.decode",
    "sparse_mla.prefill",
    "moe.route",
    "moe.experts",
    "attn.lse_combine",
    "kv.write_latent",
    "kv.write_index_keys",
    "dense.linear",
    "dense.linear_a8w8",
}

pytestmark = pytest.mark.skipif(
    not knobs.triton_interpret(),
    reason="the interpreter path: on a GPU machine the cases run compiled (hwrun conformance)",
)


def _run(platform: str) -> list[Result]:
    """The quick suite on one platform: about a minute in the interpreter on one core, so each
    platform is its own test and the three spread over the pytest workers."""
    with pytest.MonkeyPatch.context() as env:
        # Only the vendor plugins with a Triton tier, in this process and in its worker.
        env.setenv("HWRUN_DISABLE_ENTRY_POINTS", "1")
        env.setenv("HWRUN_PLUGINS", "hwrun_nvidia.plugin,hwrun_amd.plugin,hwrun_ppu.plugin")
        return run(load_plugins(), [platform], RunOptions(quick=True))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_triton_tier_conforms_and_claims_what_it_serves(platform: str) -> None:
    results = _run(platform)
    mine = [r for r in results if r.must_pass]
    bad = [(r.op, r.case, r.status, r.reason) for r in mine if r.status not in CONFORMANT]
    assert conformant(results, platform), bad

    rows = [r for r in results if r.op in TRITON_OPS]
    served = {r.op for r in rows if r.impl == "triton" and r.status == Status.PASS}
    assert served == TRITON_OPS
    # What is refused is refused for the kernel's limits (a format), never for the CPU.
    refused = [r.reason for r in rows if r.status == Status.NOT_SUPPORTED]
    assert not [reason for reason in refused if "TRITON_INTERPRET" in reason], refused

    audit = [r for r in results if r.op == "capabilities"]
    assert audit and all(r.status == Status.PASS for r in audit), audit
    unclaimed = [r.case for r in audit if "not claimed" in r.reason]
    assert not unclaimed, unclaimed
    claimed_ops = {r.case.removeprefix("ops:") for r in audit if r.case.startswith("ops:")}
    assert claimed_ops == TRITON_OPS
