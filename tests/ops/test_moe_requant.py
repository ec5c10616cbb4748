"""moe.requant: FP8 block-128 experts re-quantized to MXFP4, and the MoE contracts' specs."""

import pytest
import torch

from hwrun.formats.e8m0 import decode_e8m0
from hwrun.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from hwrun.ops.catalogue import catalogue
from hwrun.ops.moe_requant import requant
from hwrun.ops.quantized_weight import QuantizedWeight, quantize_weight
from hwrun.registry import OpSpec


def weights(shape=(4, 192, 256), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02


def rel_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


def test_requant_error_is_that_of_quantizing_the_original_directly():
    """The seeds' claim: FP8 -> MXFP4 costs about what bf16 -> MXFP4 costs."""
    w = weights()
    fp8 = quantize_weight(w, "fp8_block128", "experts.w13")
    mx = requant(fp8)
    assert mx.format == "mxfp4" and mx.shape == fp8.shape and mx.name == "experts.w13"
    direct = rel_error(dequantize_mxfp4(*quantize_mxfp4(w)), w)
    via_fp8 = rel_error(mx.dequantize(), w)
    assert 0.9 * direct < via_fp8 < 1.1 * direct


def test_requant_encodes_the_bf16_decoded_fp8_values():
    w = weights((2, 130, 64), seed=1)  # partial 128-row tiles
    fp8 = quantize_weight(w, "fp8_block128")
    mx = requant(fp8)
    for e in range(2):
        decoded = fp8.expert(e).dequantize().bfloat16()
        packed, scales = quantize_mxfp4(decoded)
        assert torch.equal(mx.data[e], packed) and torch.equal(mx.scales[e], scales)


def test_ue8m0_scaled_source_gives_the_same_bytes_as_its_fp32_scales():
    w = weights(seed=2)
    ue8m0 = quantize_weight(w, "fp8_block128_ue8m0")
    as_fp32 = QuantizedWeight("fp8_block128", ue8m0.shape, ue8m0.data, decode_e8m0(ue8m0.scales))
    a, b = requant(ue8m0), requant(as_fp32)
    assert torch.equal(a.data, b.data) and torch.equal(a.scales, b.scales)


def test_a_single_matrix_and_the_rceil_rule():
    w = weights((96, 128), seed=3)
    fp8 = quantize_weight(w, "fp8_block128")
    floor, rceil = requant(fp8), requant(fp8, rule="rceil")
    assert floor.shape == (96, 128)
    assert not torch.equal(floor.scales, rceil.scales)
    assert rel_error(rceil.dequantize(), w) < 0.2


@pytest.mark.parametrize(
    ("weight", "kwargs", "message"),
    [
        (quantize_weight(torch.ones(2, 64), "mxfp4", "w2"), {}, "w2 is mxfp4; the source must be"),
        (quantize_weight(torch.ones(2, 48), "fp8_block128", "w2"), {}, "C to be a multiple of 32"),
        (quantize_weight(torch.ones(2, 64), "fp8_block128"), {"target": "nvfp4"}, "target must"),
        (quantize_weight(torch.ones(2, 64), "fp8_block128"), {"rule": "round"}, "rule must"),
    ],
)
def test_bad_requests_are_refused(weight, kwargs, message):
    with pytest.raises(ValueError, match=r"^moe\.requant: ") as err:
        requant(weight, **kwargs)
    assert message in str(err.value)


def test_moe_contracts_are_in_the_catalogue_and_validate_their_specs():
    contracts = catalogue()
    assert {"moe.route", "moe.experts", "moe.requant"} <= set(contracts)
    for name in ("moe.route", "moe.experts", "moe.requant"):
        contract = contracts[name]
        assert contract.reference_validate(contract.default_spec) == []
    experts = contracts["moe.experts"].reference_validate
    assert experts(OpSpec("moe.experts", formats=("int4_g128",))) == []
    assert experts(OpSpec("moe.experts", formats=("fp4",))) == [
        "weight format 'fp4' is not one of ['bf16', 'fp8_block128', 'fp8_block128_ue8m0', "
        "'mxfp4', 'nvfp4', 'int4_g128']"
    ]
    assert experts(OpSpec("moe.experts", formats=("nvfp4", "a4w4"))) == [
        "activation mode 'a4w4' needs mxfp4 weights, got 'nvfp4'"
    ]
    requant_reasons = contracts["moe.requant"].reference_validate
    assert len(requant_reasons(OpSpec("moe.requant", formats=("mxfp4", "nvfp4")))) == 2
