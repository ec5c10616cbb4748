"""The NVIDIA plugin registers the Triton tier and says why it cannot serve CPU specs."""

from __future__ import annotations

from hwrun.registry import OpRegistry, OpSpec
from hwrun_nvidia import plugin

TRITON_OPS = {
    "indexer.logits_paged",
    "indexer.logits_ragged",
    "indexer.topk",
    "sparse_mla.decode",
    "attn.lse_combine",
    "kv.write_latent",
    "kv.write_index_keys",
}


def _registry() -> OpRegistry:
    registry = OpRegistry("nvidia")
    plugin.hwrun_register_ops(registry)
    return registry


def test_triton_tier_covers_the_decode_ops():
    registry = _registry()
    for op in TRITON_OPS:
        assert "triton" in [impl.name for impl in registry.impls(op)], op


def test_validate_names_device_format_and_dtype():
    impl = next(i for i in _registry().impls("indexer.logits_paged") if i.name == "triton")
    reasons = impl.validate(
        OpSpec(op="indexer.logits_paged", dtype="int8", formats=("bf16",), device_type="cpu")
    )
    text = " | ".join(reasons)
    assert "needs them on 'cuda'" in text
    assert "['bf16'] not supported" in text
    assert "query dtype int8" in text


def test_fp8_queries_need_sm89():
    impl = next(i for i in _registry().impls("indexer.logits_paged") if i.name == "triton")
    reasons = impl.validate(
        OpSpec(op="indexer.logits_paged", dtype="float8_e4m3fn", device_type="cuda", arch="sm_80")
    )
    assert any("sm_89 or newer" in r for r in reasons)


def test_sparse_mla_triton_refuses_nvfp4_latents():
    impl = next(i for i in _registry().impls("sparse_mla.decode") if i.name == "triton")
    reasons = impl.validate(OpSpec(op="sparse_mla.decode", formats=("nvfp4_ds_mla",)))
    assert any("nvfp4_ds_mla" in r for r in reasons)
