"""The TPU plugin registers its Pallas kernels: CPU specs only in an interpret mode
(HWRUN_PALLAS_INTERPRET), other devices only on a TPU; claims follow what validate accepts;
loading the plugin imports no JAX."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hwrun import knobs
from hwrun.errors import UnsupportedError
from hwrun.registry import OpRegistry, OpSpec
from hwrun.target import Target
from hwrun_tpu import plugin, tier

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


def _registry() -> OpRegistry:
    registry = OpRegistry("tpu")
    plugin.hwrun_register_ops(registry)
    return registry


def _pallas(op: str):
    return next(i for i in _registry().impls(op) if i.name == "pallas")


def test_every_kernel_is_registered_and_labelled_unvalidated():
    registry = _registry()
    assert set(registry.ops()) == PALLAS_OPS
    for op in PALLAS_OPS:
        assert "not validated on hardware" in _pallas(op).description, op


@pytest.mark.parametrize(
    ("value", "mode"),
    [("", None), ("0", None), ("off", None), ("1", "generic"), ("on", "generic"), ("TPU", "tpu")],
)
def test_the_interpret_knob(monkeypatch: pytest.MonkeyPatch, value: str, mode: str | None):
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", value)
    assert knobs.pallas_interpret() == mode


def test_cpu_specs_need_the_interpret_mode(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HWRUN_PALLAS_INTERPRET", raising=False)
    reasons = _pallas("indexer.topk").validate(OpSpec(op="indexer.topk", device_type="cpu"))
    assert any("HWRUN_PALLAS_INTERPRET=1" in r for r in reasons), reasons
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "1")
    assert _pallas("indexer.topk").validate(OpSpec(op="indexer.topk", device_type="cpu")) == []


def test_a_bad_knob_value_is_a_reason_naming_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "maybe")
    with pytest.raises(UnsupportedError) as err:
        _registry().select(OpSpec(op="indexer.topk"), allow_fallback=False)
    assert "HWRUN_PALLAS_INTERPRET='maybe'" in str(err.value.reasons)


def test_other_devices_are_refused_and_xla_needs_a_tpu_backend(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "1")
    impl = _pallas("sparse_mla.decode")
    assert any("run on TPUs" in r for r in impl.validate(OpSpec(impl.op, device_type="cuda")))
    # This machine's JAX has only its CPU backend: an "xla" spec names it.
    assert any("backend is 'cpu'" in r for r in impl.validate(OpSpec(impl.op, device_type="xla")))


def test_validate_names_format_dtype_and_head_dim(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "1")
    reasons = _pallas("sparse_mla.decode").validate(
        OpSpec("sparse_mla.decode", dtype="int8", formats=("nvfp4_ds_mla",), head_dim=512)
    )
    assert len(reasons) == 3 and "nvfp4_ds_mla" in reasons[0], reasons
    reasons = _pallas("indexer.logits_paged").validate(
        OpSpec("indexer.logits_paged", formats=("mxfp4",), head_dim=64)
    )
    assert len(reasons) == 2 and "mxfp4" in reasons[0], reasons


def test_claims_follow_validate(monkeypatch: pytest.MonkeyPatch):
    cpu = Target("tpu")
    monkeypatch.delenv("HWRUN_PALLAS_INTERPRET", raising=False)
    assert plugin.hwrun_capabilities(cpu).ops == frozenset()
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "1")
    claims = plugin.hwrun_capabilities(cpu)
    assert claims.ops == PALLAS_OPS
    assert claims.formats == {"fp8", "bf16", "fp8_ds_mla"}
    assert claims.features == {f"batch_invariant:{op}" for op in PALLAS_OPS}


def test_loading_the_plugin_and_core_imports_no_jax():
    code = (
        "import sys\n"
        "import hwrun.cli, hwrun.registry, hwrun.ops.catalogue\n"
        "from hwrun_tpu import plugin\n"
        "from hwrun.registry import OpRegistry\n"
        "plugin.hwrun_register_ops(OpRegistry('tpu'))\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_chips_are_known_by_their_tpu_info_names():
    assert tier.chip_info("V6E").vmem_capacity_bytes == 128 * 2**20
    assert tier.chip_info("v7x").vmem_capacity_bytes == 64 * 2**20
    assert tier.chip_info("V9Z") is None


def test_on_a_tpu_the_attention_must_fit_the_chips_vmem(monkeypatch: pytest.MonkeyPatch):
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # as on a TPU host
    decode = _pallas("sparse_mla.decode")

    def spec(arch: str, topk: int) -> OpSpec:
        return OpSpec(
            decode.op,
            formats=("fp8_ds_mla",),
            num_heads=128,
            topk=topk,
            device_type="xla",
            arch=arch,
        )

    assert decode.validate(spec("V4", 2048)) == []  # the models' shape fits 16 MiB
    reasons = decode.validate(spec("V4", 8192))
    assert len(reasons) == 1 and "MiB of VMEM" in reasons[0] and "16 MiB" in reasons[0], reasons
    assert decode.validate(spec("V5E", 8192)) == []  # 128 MiB
    assert "not a chip" in decode.validate(spec("V9Z", 2048))[0]
