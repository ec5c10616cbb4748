"""The AMD plugin registers the shared Triton tier: ROCm specs by architecture (OCP fp8 refused
on gfx942, which computes FNUZ), CPU specs only in Triton's interpreter; claims follow."""

from __future__ import annotations

import pytest

from hwrun.platform import DeviceInfo
from hwrun.registry import OpRegistry, OpSpec
from hwrun.target import Target
from hwrun_amd import device_checks, plugin

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


def _triton(op: str):
    registry = OpRegistry("amd")
    plugin.hwrun_register_ops(registry)
    return next(i for i in registry.impls(op) if i.name == "triton")


@pytest.fixture
def rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_checks, "_rocm_available", lambda: True)


def test_the_triton_tier_covers_the_decode_ops():
    registry = OpRegistry("amd")
    plugin.hwrun_register_ops(registry)
    assert {op for op in TRITON_OPS if registry.impls(op)} == TRITON_OPS
    assert all(i.name == "triton" for op in TRITON_OPS for i in registry.impls(op))


@pytest.mark.parametrize(
    ("op", "fmt"),
    [("sparse_mla.decode", "fp8_ds_mla"), ("indexer.logits_paged", "fp8")],
)
def test_gfx942_refuses_ocp_fp8_reads_with_the_fnuz_reason(rocm, op: str, fmt: str):
    spec = OpSpec(op=op, formats=(fmt,), device_type="cuda", arch="gfx942")
    reasons = _triton(op).validate(spec)
    assert any("FNUZ" in r and "gfx942" in r for r in reasons), reasons
    gfx950 = OpSpec(op=op, formats=(fmt,), device_type="cuda", arch="gfx950")
    assert _triton(op).validate(gfx950) == []


def test_gfx942_serves_bf16_latents_and_exact_fp8_writes(rocm):
    decode = OpSpec(op="sparse_mla.decode", formats=("bf16",), device_type="cuda", arch="gfx942")
    assert _triton("sparse_mla.decode").validate(decode) == []
    write = OpSpec(op="kv.write_latent", formats=("fp8_ds_mla",), device_type="cuda", arch="gfx942")
    assert _triton("kv.write_latent").validate(write) == []


def test_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reasons = _triton("indexer.topk").validate(OpSpec(op="indexer.topk", device_type="cpu"))
    assert any("TRITON_INTERPRET=1" in r for r in reasons)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _triton("indexer.topk").validate(OpSpec(op="indexer.topk", device_type="cpu")) == []


def test_claims_on_gfx942_leave_out_what_it_refuses(rocm, monkeypatch: pytest.MonkeyPatch):
    mi300 = DeviceInfo(index=0, vendor="amd", name="MI300X", arch="gfx942", device_type="cuda")
    claims = plugin.hwrun_capabilities(Target("amd", "cuda", (mi300,)))
    assert "indexer.logits_paged" not in claims.ops  # its keys are read as OCP e4m3fn
    assert {"sparse_mla.decode", "kv.write_latent", "indexer.topk"} <= claims.ops
    # The writes are exact; the W4A16 MoE multiplies bf16 (int4 codes widened in the kernel).
    assert claims.formats == {"bf16", "fp8_ds_mla", "fp8", "mxfp4", "int4_g128"}


def test_no_claims_without_a_device_or_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    claims = plugin.hwrun_capabilities(Target("amd"))
    assert not claims.ops and not claims.formats and not claims.features
