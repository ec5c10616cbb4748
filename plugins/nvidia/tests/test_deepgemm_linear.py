"""The DeepGEMM ``dense.linear_a8w8`` adapter against a fake ``deep_gemm`` that follows
``fp8_gemm_nt``'s documented SM90 conventions (e4m3 K-major operands, fp32 activation scales
tokens first with a 16-byte-aligned column stride, fp32 128 x 128 weight scales, a bf16
N-major output) and computes the product from them: what the adapter hands DeepGEMM, which row
counts go where, and what validate refuses. The real library runs in test_adapters_gpu.py."""

from __future__ import annotations

import os
import types

import pytest
import torch

if not torch.cuda.is_available():  # the quantizer runs in Triton's interpreter (tests/conftest.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hwrun.ops.linear import linear_a8w8 as reference
from hwrun.ops.quantized_weight import quantize_weight
from hwrun.registry import OpRegistry, OpSpec
from hwrun_nvidia import deepgemm_linear, device_checks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _fake_deep_gemm():
    calls = []

    def fp8_gemm_nt(a, b, d):
        (a_codes, a_scales), (b_codes, b_scales) = a, b
        m, k = a_codes.shape
        n = b_codes.shape[0]
        assert a_codes.dtype == b_codes.dtype == torch.float8_e4m3fn
        assert a_codes.stride(1) == 1 and b_codes.stride(1) == 1  # K-major
        assert a_scales.dtype == b_scales.dtype == torch.float32
        assert a_scales.shape == (m, k // 128)
        # already in the layout the SM90 kernel reads: no transpose launch
        assert a_scales.stride() == (1, -(-m // 4) * 4), a_scales.stride()
        assert b_scales.shape == (-(-n // 128), k // 128) and b_scales.is_contiguous()
        assert d.dtype == torch.bfloat16 and d.shape == (m, n) and d.is_contiguous()
        x = a_codes.float() * a_scales.repeat_interleave(128, 1)
        w = b_codes.float() * b_scales.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        d.copy_(x @ w.t())
        calls.append((m, n, k))

    return types.SimpleNamespace(fp8_gemm_nt=fp8_gemm_nt), calls


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    module, calls = _fake_deep_gemm()
    monkeypatch.setitem(__import__("sys").modules, "deep_gemm", module)
    return calls


def _inputs(tokens: int, rows: int, cols: int):
    g = torch.Generator().manual_seed(tokens * 7 + rows)
    w = torch.randn(rows, cols, generator=g) * 0.02
    x = (torch.randn(tokens, cols, generator=g) * 0.1).to(torch.bfloat16)
    x[0, 3] = 300.0  # an outlier: its group's scale
    return x.to(DEVICE), quantize_weight(w.to(DEVICE), "fp8_block128")


@pytest.mark.parametrize("tokens", [16, 21, 64])
def test_rows_from_the_crossover_go_to_deepgemm_in_its_layout(fake, tokens):
    x, weight = _inputs(tokens, 192, 384)
    got = deepgemm_linear.linear_a8w8(x, weight)
    assert fake == [(tokens, 192, 384)]
    want = reference(x, weight)
    # the fake sums in another order than the reference's row-by-row products
    scale = float(want.float().abs().amax())
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3 * scale)


def test_given_codes_and_scales_go_to_deepgemm_without_a_quantizer_launch(fake, monkeypatch):
    from hwrun.kernels.triton.activation_quant import quantize_activations

    x, weight = _inputs(24, 192, 384)
    quantized = quantize_activations(x, False, token_major_scales=True)
    want = deepgemm_linear.linear_a8w8(x, weight)

    def no_quantizer(*args, **kwargs):
        raise AssertionError("the adapter quantized x although its codes were given")

    monkeypatch.setattr(deepgemm_linear, "quantize_activations", no_quantizer)
    assert torch.equal(deepgemm_linear.linear_a8w8(x, weight, quantized), want)
    assert fake == [(24, 192, 384)] * 2


@pytest.mark.parametrize("tokens,rows", [(1, 192), (15, 192), (64, 160)])
def test_few_rows_and_uneven_weights_take_the_triton_kernel(fake, tokens, rows):
    x, weight = _inputs(tokens, rows, 256)
    got = deepgemm_linear.linear_a8w8(x, weight)
    assert fake == []
    want = reference(x, weight)
    scale = float(want.float().abs().amax())
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3 * scale)


def test_bad_input_is_refused_with_the_contract_reasons(fake):
    x, weight = _inputs(16, 192, 384)
    with pytest.raises(ValueError, match="C must agree"):
        deepgemm_linear.linear_a8w8(x[:, :256], weight)
    with pytest.raises(ValueError, match="takes bf16 x"):
        deepgemm_linear.linear_a8w8(x.float(), weight)


def _spec(dtype="bfloat16", fmt="fp8_block128", device_type="cuda", arch="sm_90") -> OpSpec:
    return OpSpec("dense.linear_a8w8", dtype, (fmt,), device_type=device_type, arch=arch)


def test_validate_needs_deepgemm_sm90_bf16_and_fp32_scales(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    monkeypatch.setattr(deepgemm_linear, "importable", lambda module: True)
    assert deepgemm_linear._validate(_spec()) == []
    for spec, reason in (
        (_spec(fmt="fp8_block128_ue8m0"), "['fp8_block128_ue8m0'] not supported"),
        (_spec(dtype="float32"), "input dtype float32"),
        (_spec(arch="sm_100"), "the device is sm_100"),
        (_spec(arch="sm_89"), "needs sm_90 or newer"),
        (_spec(device_type="cpu", arch=None), "on 'cpu'"),
    ):
        assert any(reason in r for r in deepgemm_linear._validate(spec)), (spec, reason)
    monkeypatch.setattr(deepgemm_linear, "importable", lambda module: False)
    assert any("pip install" in r for r in deepgemm_linear._validate(_spec()))


def test_registered_above_triton_where_deepgemm_imports(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(deepgemm_linear, "importable", lambda module: True)
    registry = OpRegistry("nvidia")
    deepgemm_linear.register(registry)
    (impl,) = registry.impls("dense.linear_a8w8")
    assert impl.name == "deepgemm" and impl.priority == 20
    assert impl.graph_safe and not impl.batch_invariant
    monkeypatch.setattr(deepgemm_linear, "importable", lambda module: False)
    registry = OpRegistry("nvidia")
    deepgemm_linear.register(registry)
    assert registry.impls("dense.linear_a8w8") == []
