"""The PPU plugin: its devices carry their model as the arch, the shared Triton tier (the W4A16
MoE included) under the PPU's limits (no fp8 products on the 810E, Triton >= 3.4), claims that
follow, and the deployment rules of vllm-sail's validated layouts. The quick conformance suite
of the tier in Triton's interpreter is tests/conformance/test_triton_tier.py."""

from __future__ import annotations

import pytest

from hwrun.deployment import Deployment
from hwrun.kernels.triton.registration import FAMILIES
from hwrun.ops.catalogue import catalogue
from hwrun.platform import DeviceInfo
from hwrun.registry import OpRegistry, OpSpec
from hwrun.target import Target
from hwrun_ppu import device_checks, plugin, serve_recipe

KIMI = "moonshotai/Kimi-K3.1-Pro"


TIER_OPS = {kernel.op for family in FAMILIES.values() for kernel in family}  # core's tier


def _triton_ops() -> set[str]:
    registry = OpRegistry("ppu")
    plugin.hwrun_register_ops(registry)
    return {op for op in catalogue() if any(i.name == "triton" for i in registry.impls(op))}


def _triton(op: str):
    registry = OpRegistry("ppu")
    plugin.hwrun_register_ops(registry)
    return next(i for i in registry.impls(op) if i.name == "triton")


def _ppus(name: str, count: int = 2) -> Target:
    arch = device_checks.model_of(name)
    devices = tuple(
        DeviceInfo(index=i, vendor="ppu", name=name, arch=arch, device_type="cuda")
        for i in range(count)
    )
    return Target("ppu", "cuda", devices)


@pytest.fixture
def sail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_checks, "_sail_available", lambda: True)
    monkeypatch.setattr(device_checks, "triton_version", lambda: (3, 4))


def test_devices_carry_their_model_as_arch(monkeypatch: pytest.MonkeyPatch):
    found = [
        DeviceInfo(index=0, vendor="ppu", name="PPU-810E", device_type="cuda"),
        DeviceInfo(index=1, vendor="ppu", name="Zhenwu m890", device_type="cuda"),
        DeviceInfo(index=2, vendor="ppu", name="Zhenwu PPU", device_type="cuda"),
    ]
    monkeypatch.setattr(device_checks, "detect_ppu", lambda: found)
    assert [d.arch for d in device_checks.detect()] == ["810E", "M890", None]


def test_the_whole_triton_tier_is_registered_with_the_w4a16_moe(sail):
    assert _triton_ops() == TIER_OPS and "moe.experts" in TIER_OPS
    spec = OpSpec(
        op="moe.experts", dtype="bfloat16", formats=("int4_g128", "bf16"), device_type="cuda"
    )
    assert _triton("moe.experts").validate(spec) == []


@pytest.mark.parametrize("arch", ["810E", "M890", None])
def test_fp8_products_are_refused_and_bf16_queries_run(sail, arch):
    fp8 = OpSpec(op="indexer.logits_paged", dtype="float8_e4m3fn", device_type="cuda", arch=arch)
    reasons = _triton("indexer.logits_paged").validate(fp8)
    assert len(reasons) == 1 and "multiplies in fp8" in reasons[0], reasons
    if arch == "810E":
        assert "810E has no fp8 tensor-core products" in reasons[0]
    bf16 = OpSpec(op="indexer.logits_paged", dtype="bfloat16", device_type="cuda", arch=arch)
    assert _triton("indexer.logits_paged").validate(bf16) == []


def test_an_older_triton_is_refused_with_its_version(sail, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(device_checks, "triton_version", lambda: (3, 1))
    spec = OpSpec(op="indexer.topk", device_type="cuda", arch="810E")
    reasons = _triton("indexer.topk").validate(spec)
    assert any("Triton 3.1 is installed" in r and ">= 3.4" in r for r in reasons), reasons


def test_no_ppu_visible_is_a_reason(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(device_checks, "_sail_available", lambda: False)
    reasons = _triton("indexer.topk").validate(OpSpec(op="indexer.topk", device_type="cuda"))
    assert any("SAIL torch" in r for r in reasons), reasons


def test_claims_on_an_810e(sail):
    claims = plugin.hwrun_capabilities(_ppus("PPU-810E"))
    # bf16 queries run everywhere; fp8 ones are refused per spec. dense.linear_a8w8 always
    # multiplies e4m3 x e4m3, which the 810E cannot: it is not claimed, nor is moe.experts' a8w8.
    assert claims.ops == TIER_OPS - {"dense.linear_a8w8"}
    assert "int4_g128" in claims.formats and "a8w8" not in claims.formats


def test_no_claims_without_a_device_or_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    claims = plugin.hwrun_capabilities(Target("ppu"))
    assert not claims.ops and not claims.formats and not claims.features


LAYOUT_810E = {"tensor_parallel": 32, "nodes": 2, "expert_parallel": True}
LAYOUT_M890 = {"tensor_parallel": 8, "data_parallel": 4, "nodes": 4, "expert_parallel": True}


@pytest.mark.parametrize(
    ("layout", "name"), [(LAYOUT_810E, "PPU-810E"), (LAYOUT_M890, "Zhenwu M890")]
)
def test_the_validated_layouts_pass_on_their_ppu(layout, name):
    deployment = Deployment(KIMI, **layout)
    assert serve_recipe.hwrun_validate_deployment(deployment, _ppus(name, 16)) == []


def test_everything_outside_the_validated_configurations_is_refused_at_once():
    deployment = Deployment(
        "mistralai/Mistral-Large-4-1T-A52B",
        decode_context_parallel=2,
        moe_requant="mxfp4",
        moe_activation="a8w4",
        **LAYOUT_810E,
    )
    reasons = serve_recipe.hwrun_validate_deployment(deployment, _ppus("PPU-810E", 16))
    assert len(reasons) == 3, reasons
    assert "validated for Kimi K3.1 Pro only" in reasons[0]
    assert "context parallelism (DCP 2" in reasons[1]
    assert "VLLM_FP8_MOE_REQUANT=mxfp4, VLLM_FP8_MOE_REQUANT_ACT=a8w4" in reasons[2]
    assert "no fp8 tensor-core products" in reasons[2]


def test_a_layout_on_the_other_ppu_is_refused():
    reasons = serve_recipe.hwrun_validate_deployment(
        Deployment(KIMI, **LAYOUT_M890), _ppus("PPU-810E", 16)
    )
    assert len(reasons) == 1 and "validated on M890" in reasons[0]
