"""The NVIDIA plugin registers the Triton tier: CPU specs only in Triton's interpreter, CUDA
specs by architecture; the adapters always need CUDA; claims follow what validate accepts."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from hwrun.devices import NoDevices
from hwrun.platform import DeviceInfo
from hwrun.registry import OpRegistry, OpSpec
from hwrun.target import Target
from hwrun_nvidia import device_checks, plugin

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
# The moe.experts formats claimed; a8w8 is claimed with fp8_block128 weights (its only pairing).
EXPERT_WEIGHTS = {"fp8_block128", "int4_g128", "a8w8"}
LINEAR_WEIGHTS = {"fp8_block128", "fp8_block128_ue8m0"}  # dense.linear's (and bf16)
CLAIMED_FORMATS = {"fp8", "mxfp4", "fp8_ds_mla", "bf16", *EXPERT_WEIGHTS, *LINEAR_WEIGHTS}


def _registry() -> OpRegistry:
    registry = OpRegistry("nvidia")
    plugin.hwrun_register_ops(registry)
    return registry


def test_triton_tier_covers_the_decode_ops():
    registry = _registry()
    for op in TRITON_OPS:
        assert "triton" in [impl.name for impl in registry.impls(op)], op


def _triton(op: str):
    return next(i for i in _registry().impls(op) if i.name == "triton")


def test_validate_names_device_format_and_dtype(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reasons = _triton("indexer.logits_paged").validate(
        OpSpec(op="indexer.logits_paged", dtype="int8", formats=("bf16",), device_type="cpu")
    )
    text = " | ".join(reasons)
    assert "tensors are on 'cpu'" in text and "TRITON_INTERPRET=1" in text
    assert "['bf16'] not supported" in text
    assert "query dtype int8" in text


def test_interpreter_serves_cpu_specs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for op in TRITON_OPS:
        assert _triton(op).validate(OpSpec(op=op, device_type="cpu")) == [], op


def test_adapters_still_need_cuda_under_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    from hwrun_nvidia import deepgemm, flashmla

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = OpSpec(op="indexer.logits_paged", device_type="cpu")
    assert any("needs them on 'cuda'" in r for r in deepgemm._validate(spec, paged=True))
    assert any("needs them on 'cuda'" in r for r in flashmla._validate(spec, decode=True))


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_claims_follow_what_validate_accepts(monkeypatch: pytest.MonkeyPatch, interpret: str):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    claims = plugin.hwrun_capabilities(Target("nvidia"))  # no NVIDIA GPU: CPU tensors
    if interpret == "0":
        assert not claims.ops and not claims.formats and not claims.features
        return
    assert claims.ops == TRITON_OPS
    assert claims.formats == CLAIMED_FORMATS
    assert "batch_invariant:attn.lse_combine" in claims.features
    assert "batch_invariant:indexer.topk" not in claims.features  # atomics order the output


def test_fp8_queries_need_sm89(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    reasons = _triton("indexer.logits_paged").validate(
        OpSpec(op="indexer.logits_paged", dtype="float8_e4m3fn", device_type="cuda", arch="sm_80")
    )
    assert any("sm_89 or newer" in r for r in reasons)


@pytest.mark.parametrize(
    ("op", "formats"),
    [("moe.experts", ("fp8_block128", "a8w8")), ("dense.linear_a8w8", ("fp8_block128",))],
)
def test_e4m3_products_need_sm89(monkeypatch: pytest.MonkeyPatch, op: str, formats: tuple):
    """a8w8 multiplies e4m3 x e4m3 on the matrix units: an A100 has none, so neither op claims
    it there, while bf16 activations against the same fp8 weights still run on sm_80."""
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    spec = OpSpec(op=op, dtype="bfloat16", formats=formats, device_type="cuda", arch="sm_80")
    assert any("sm_89 or newer" in r for r in _triton(op).validate(spec))
    assert not _triton(op).validate(dataclasses.replace(spec, arch="sm_90"))
    bf16_activations = dataclasses.replace(spec, op="moe.experts", formats=("fp8_block128", "bf16"))
    assert not _triton("moe.experts").validate(bf16_activations)


def test_sparse_mla_triton_refuses_nvfp4_latents():
    reasons = _triton("sparse_mla.decode").validate(
        OpSpec(op="sparse_mla.decode", formats=("nvfp4_ds_mla",))
    )
    assert any("nvfp4_ds_mla" in r for r in reasons)


def test_claims_on_an_h200_target(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    h200 = DeviceInfo(0, "nvidia", "NVIDIA H200", "sm_90", device_type="cuda")
    claims = plugin.hwrun_capabilities(Target("nvidia", "cuda", (h200,)))
    assert claims.ops == TRITON_OPS
    assert claims.formats == CLAIMED_FORMATS


@pytest.mark.parametrize("op", ["moe.route", "indexer.to_slots"])
def test_triton_serves_route_and_to_slots_over_the_torch_tier(monkeypatch, op: str):
    """One launch each where the torch tier takes several: Triton is chosen on an H200, both
    graph-safe and batch-invariant; the torch impl stays registered under it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    registry = _registry()
    assert [impl.name for impl in registry.impls(op)] == ["triton", "torch"]
    chosen = registry.select(OpSpec(op=op, device_type="cuda", arch="sm_90")).impl
    assert chosen.name == "triton" and chosen.graph_safe and chosen.batch_invariant


def test_devices_come_from_nvml(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py missing
    with pytest.raises(NoDevices, match="nvidia-ml-py is not importable"):
        plugin.hwrun_devices()
