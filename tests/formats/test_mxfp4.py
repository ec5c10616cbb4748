import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx

from hwrun.formats import mxfp4

from .conftest import E2M1, ml_codes, ml_values, spread


def test_e2m1_matches_ml_dtypes_on_random_ties_and_saturation(gen):
    grid = torch.arange(-28, 29, dtype=torch.float32) * 0.25  # every code and every midpoint
    x = torch.cat(
        [
            grid,
            torch.randn(20000, generator=gen) * 3,
            torch.tensor([1e30, -1e30, math.inf, -math.inf, 0.0, -0.0, 1e-40, -1e-40]),
        ]
    )
    assert torch.equal(mxfp4.encode_e2m1(x), ml_codes(x, E2M1))


def test_e2m1_nan_is_code_zero():
    # ml_dtypes maps NaN to 0x8 (a negative zero); hwrun picks +0: NaN blocks are marked by
    # their 0xFF scale, the element code only has to be deterministic.
    assert mxfp4.encode_e2m1(torch.tensor([math.nan, -math.nan])).tolist() == [0, 0]


def test_e2m1_decode_every_code():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(mxfp4.decode_e2m1(codes), ml_values(codes, E2M1))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=64))
def test_e2m1_roundtrip(codes):
    b = torch.tensor(codes, dtype=torch.uint8)
    assert torch.equal(mxfp4.encode_e2m1(mxfp4.decode_e2m1(b)), b)


def mx_cases(gen) -> torch.Tensor:
    x = spread(gen, 64, 256)
    x[0] = 0.0  # all-zero blocks
    x[1, :32] = -2.5  # all-equal block
    x[1, 32:64] = 6.0  # amax exactly on the largest code
    x[1, 64:96] = 7.999  # FLOOR saturates
    x[1, 96:128] = 2.0**-130  # subnormal amax
    x[2, :32] = torch.arange(32) * 0.25 - 4  # ties at every midpoint
    x[2, 32:64] = 1e36  # huge values
    x[5, :4] = torch.tensor([math.inf, 1.0, -math.inf, -1.0])  # infinities saturate to +/-6
    return x


def test_floor_matches_torchao(gen):
    x = mx_cases(gen)
    packed, scales = mxfp4.quantize_mxfp4(x, "floor")
    ao_scales, ao_packed = to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    assert torch.equal(scales, ao_scales.view(torch.uint8))
    # torchao divides code-0 blocks by 2^-126 instead of 2^-127 (its own clamp); outside those
    # blocks every byte agrees.
    keep = (scales != 0).repeat_interleave(16, -1)
    assert torch.equal(packed[keep], ao_packed.view(torch.uint8)[keep])


def test_rceil_matches_torchao_away_from_the_log2_rounding(gen):
    x = mx_cases(gen)
    packed, scales = mxfp4.quantize_mxfp4(x, "rceil")
    ao_scales, ao_packed = to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.RCEIL)
    # torchao's eager RCEIL takes torch.log2 (may round) and multiplies code-0 blocks by 1.0.
    assert torch.equal(scales[3:], ao_scales.view(torch.uint8)[3:])
    assert torch.equal(packed[3:], ao_packed.view(torch.uint8)[3:])


def test_scale_rules_on_chosen_amaxes():
    x = torch.zeros(6, 32)
    x[:, 0] = torch.tensor([6.0, 7.999, 8.0, 0.0, 1.5, 12.0])
    _, floor = mxfp4.quantize_mxfp4(x, "floor")
    _, rceil = mxfp4.quantize_mxfp4(x, "rceil")
    # floor: 2^(floor(log2 amax) - 2); rceil: 2^ceil(log2(amax / 6)).
    assert floor.flatten().tolist() == [127, 127, 128, 0, 125, 128]
    assert rceil.flatten().tolist() == [127, 128, 128, 0, 125, 128]


def test_nan_block_scale_is_ff():
    x = torch.ones(2, 32)
    x[1, 3] = math.nan
    _, scales = mxfp4.quantize_mxfp4(x)
    assert scales.flatten().tolist() == [125, 255]


def test_inf_block_scale_is_fd_under_floor_and_fe_under_rceil():
    # Documented in docs/formats.md: torchao's FLOOR gives 0xFD; OCP's reference code NaN.
    x = torch.ones(2, 32)
    x[1, 3] = math.inf
    for rule, code in (("floor", 0xFD), ("rceil", 0xFE)):
        packed, scales = mxfp4.quantize_mxfp4(x, rule=rule)
        assert scales.flatten().tolist()[1] == code
        back = mxfp4.dequantize_mxfp4(packed, scales)
        assert back[1, 3].item() == math.inf and bool((back[1, :3] == 0).all())
        assert bool((back[0] == 1).all())


def test_packing_low_nibble_is_the_even_element():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 4.0, -1.0  # amax 4: floor scale 2^0 -> codes 6 and 0xA
    packed, scales = mxfp4.quantize_mxfp4(x)
    assert scales.item() == 127 and packed[0, 0].item() == 0xA6


@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_decode_error_bound(gen, rule):
    x = spread(gen, 32, 128)
    packed, scales = mxfp4.quantize_mxfp4(x, rule)
    back = mxfp4.dequantize_mxfp4(packed, scales)
    s = mxfp4.decode_e8m0(scales).repeat_interleave(32, -1)
    # half a step (1 * s at the top binade) plus, for FLOOR, the saturation above 6s (< 8s).
    bound = s * (2.0 if rule == "floor" else 1.0)
    assert bool(((back - x).abs() <= bound).all())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=16, max_size=16), st.integers(1, 250))
def test_canonical_blocks_roundtrip(nibbles, scale_code):
    # A block whose first element has magnitude code 7 (6 times the scale) is canonical under
    # both rules: quantizing its decode gives the same bytes back.
    packed = torch.tensor(nibbles, dtype=torch.uint8).reshape(1, 16)
    packed[0, 0] = packed[0, 0] | 0x7
    scales = torch.tensor([[scale_code]], dtype=torch.uint8)
    for rule in mxfp4.SCALE_RULES:
        again_packed, again_scales = mxfp4.quantize_mxfp4(
            mxfp4.dequantize_mxfp4(packed, scales), rule
        )
        assert torch.equal(again_scales, scales)
        assert torch.equal(again_packed, packed)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: mxfp4.quantize_mxfp4(torch.ones(2, 48)), "multiple of 32"),
        (lambda: mxfp4.quantize_mxfp4(torch.ones(2, 32), rule="even"), "floor"),
        (lambda: mxfp4.quantize_mxfp4(torch.ones(2, 32, dtype=torch.uint8)), "float32"),
        (
            lambda: mxfp4.dequantize_mxfp4(
                torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8)
            ),
            "[2, 1]",
        ),
        (lambda: mxfp4.dequantize_mxfp4(torch.zeros(2, 16), torch.zeros(2, 1)), "uint8"),
    ],
)
def test_bad_input_names_the_expected_shape(call, needle):
    with pytest.raises(ValueError, match=__import__("re").escape(needle)):
        call()
