"""dense.linear's reference: the definition (decoded weight, fp32 products, one rounding), row
independence, and its refusals."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.fp8 import dequantize_fp8_block128
from hwrun.ops.catalogue import catalogue
from hwrun.ops.linear import A8W8_WEIGHT_FORMATS, LINEAR_WEIGHT_FORMATS, linear, linear_a8w8
from hwrun.ops.quantized_weight import quantize_weight
from hwrun.registry import OpSpec


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("fmt", LINEAR_WEIGHT_FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_is_the_fp32_product_with_the_decoded_weight_rounded_once(fmt, dtype):
    g = torch.Generator().manual_seed(1)
    weight = quantize_weight(torch.randn(200, 300, generator=g) * 0.05, fmt, "w")  # partial tiles
    x = torch.randn(7, 300, generator=g).to(dtype)
    got = linear(x, weight)
    assert got.dtype == dtype and got.shape == (7, 200)
    exact = x.double() @ weight.dequantize().double().T
    # fp32 sums against exact ones: a bf16 output within one rounding, an fp32 one within the
    # sums' rounding (relative to the row's scale where terms cancel).
    rtol = 2**-8 if dtype == torch.bfloat16 else 1e-6
    atol = 1e-6 * float(exact.abs().max())
    torch.testing.assert_close(got.double(), exact, rtol=rtol, atol=atol)


def test_the_block_fp8_weight_is_decoded_exactly_by_the_formats():
    g = torch.Generator().manual_seed(2)
    weight = quantize_weight(torch.randn(130, 260, generator=g), "fp8_block128", "w")
    x = torch.eye(260)  # row i of the output is column i of the decoded weight
    decoded = dequantize_fp8_block128(weight.data, weight.scales)
    assert torch.equal(linear(x, weight), decoded.T)


def _assert_rows_alone_match_batched(fn, x, weight) -> None:
    batched = fn(x, weight)
    for row in range(x.shape[0]):
        assert torch.equal(_bits(fn(x[row : row + 1], weight)), _bits(batched[row : row + 1]))


def test_each_row_has_the_same_bits_alone_and_batched():
    g = torch.Generator().manual_seed(3)
    weight = quantize_weight(torch.randn(96, 512, generator=g), "fp8_block128_ue8m0", "w")
    x = torch.randn(9, 512, generator=g).to(torch.bfloat16)
    _assert_rows_alone_match_batched(linear, x, weight)


def test_no_rows():
    weight = quantize_weight(torch.randn(8, 16), "bf16", "w")
    assert linear(torch.empty(0, 16, dtype=torch.bfloat16), weight).shape == (0, 8)


def test_refuses_with_every_reason():
    x = torch.randn(3, 64)
    stack = quantize_weight(torch.randn(2, 8, 64), "bf16", "experts")
    with pytest.raises(ValueError, match=r"weight \(experts\) must be \[R, C\], got \[2, 8, 64\]"):
        linear(x, stack)
    mxfp4 = quantize_weight(torch.randn(8, 32), "mxfp4", "w")
    with pytest.raises(ValueError) as err:
        linear(x, mxfp4)
    assert "C must agree" in str(err.value) and "w is mxfp4" not in str(err.value)
    assert "weight (w) is mxfp4; dense.linear takes" in str(err.value)
    with pytest.raises(ValueError, match="must be a QuantizedWeight"):
        linear(x, torch.randn(8, 64))
    with pytest.raises(ValueError, match=r"x must be a float tensor \[T, C\]"):
        linear(torch.ones(3, 64, dtype=torch.int32), quantize_weight(torch.randn(8, 64), "bf16"))


def test_is_catalogued_and_the_reference_refuses_other_formats():
    contract = catalogue()["dense.linear"]
    assert contract.reference is linear
    assert contract.reference_validate(contract.default_spec) == []
    reasons = contract.reference_validate(OpSpec("dense.linear", formats=("bf16", "nvfp4")))
    assert reasons and "['nvfp4']" in reasons[0]


# -- dense.linear_a8w8 --------------------------------------------------------------------------


def _deepseek_act_quant(x: torch.Tensor, ue8m0: bool) -> torch.Tensor:  # [T, C] -> float64
    """x quantized per token and 128 columns as DeepSeek's ``act_quant`` and DeepGEMM's
    per-token cast write it, in plain torch (not through hwrun.formats), decoded to float64."""
    groups = x.float().view(x.shape[0], -1, 128)
    scale = groups.abs().amax(-1).clamp(min=1e-4) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    codes = (groups / scale[..., None]).to(torch.float8_e4m3fn)
    return (codes.double() * scale.double()[..., None]).view(x.shape)


@pytest.mark.parametrize("fmt", A8W8_WEIGHT_FORMATS)
def test_a8w8_is_the_product_of_deepseeks_quantized_activations(fmt):
    g = torch.Generator().manual_seed(11)
    weight = quantize_weight(torch.randn(200, 384, generator=g) * 0.05, fmt, "w")
    x = (torch.randn(6, 384, generator=g) * 3).to(torch.bfloat16)
    x[1, :128] = 0  # an all-zero group: the 1e-4 amax floor
    x[2, 130] = 2000.0  # an outlier sets its own group's scale only
    got = linear_a8w8(x, weight)
    assert got.dtype == torch.bfloat16 and got.shape == (6, 200)
    exact = _deepseek_act_quant(x, fmt.endswith("ue8m0")) @ weight.dequantize().double().T
    atol = 1e-6 * float(exact.abs().max())
    torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=atol)
    # Negative control: without the activations' quantization the outputs move by far more.
    plain = linear(x, weight).double()
    assert ((plain - exact).abs() > 2**-6 * exact.abs() + atol).any()


def test_a8w8_rows_are_independent_and_refusals_name_the_op():
    g = torch.Generator().manual_seed(12)
    weight = quantize_weight(torch.randn(96, 256, generator=g), "fp8_block128", "w")
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    _assert_rows_alone_match_batched(linear_a8w8, x, weight)
    assert linear_a8w8(x[:0], weight).shape == (0, 96)
    with pytest.raises(ValueError, match=r"dense.linear_a8w8: weight \(w\) is bf16; .* takes"):
        linear_a8w8(x, quantize_weight(torch.randn(96, 256), "bf16", "w"))
    with pytest.raises(ValueError, match="C = 200 must be a multiple of 128"):
        linear_a8w8(torch.randn(2, 200), quantize_weight(torch.randn(8, 200), "fp8_block128", "w"))
    contract = catalogue()["dense.linear_a8w8"]
    assert contract.reference is linear_a8w8
    assert contract.reference_validate(contract.default_spec) == []
    assert contract.reference_validate(OpSpec("dense.linear_a8w8", formats=("bf16",)))


def test_a8w8_quantized_rows_are_checked_for_shape_and_define_nothing():
    """``quantized`` is the caller's promise of x's codes and scales: the reference checks its
    shapes, dtypes and device, and computes from x (another x's codes change nothing)."""
    from hwrun.formats.fp8 import quantize_fp8_groups

    g = torch.Generator().manual_seed(13)
    weight = quantize_weight(torch.randn(96, 256, generator=g), "fp8_block128", "w")
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    codes, scales = quantize_fp8_groups(x.float(), 128)
    want = linear_a8w8(x, weight)
    assert torch.equal(linear_a8w8(x, weight, (codes, scales)), want)
    assert torch.equal(linear_a8w8(x, weight, quantize_fp8_groups(-x.float(), 128)), want)
    with pytest.raises(ValueError, match=r"quantized codes must be torch.uint8 \[5, 256\]"):
        linear_a8w8(x, weight, (codes[:4], scales))
    with pytest.raises(ValueError, match="quantized scales must be a tensor, got NoneType"):
        linear_a8w8(x, weight, (codes, None))
