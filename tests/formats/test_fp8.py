import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.formats import fp8

from .conftest import E4M3, ml_codes, ml_values, spread

EDGES = [
    0.0,
    -0.0,
    448.0,
    -448.0,
    464.0,
    480.0,
    1e6,
    -1e6,
    math.inf,
    -math.inf,
    2.0**-9,
    2.0**-10,
    3 * 2.0**-11,
    2.0**-6,
    0.0625 * 1.0625,
    1.0625,
    1.1875,
    17.0,
    19.0,
    240.0,
    232.0,
    1e-30,
    -(2.0**-9),
]


def canonical_e4m3_codes() -> torch.Tensor:
    """Every code except the NaNs (0x7F, 0xFF)."""
    codes = torch.arange(256, dtype=torch.int32)
    return codes[(codes & 0x7F) != 0x7F].to(torch.uint8)


def test_encode_matches_ml_dtypes_and_torch_on_random_and_edges(gen):
    x = torch.cat([spread(gen, 20000) * 8, torch.tensor(EDGES)])
    finite = x.clamp(-448, 448)  # ml_dtypes turns overflow into NaN; hwrun saturates
    got = fp8.encode_e4m3(x)
    assert torch.equal(got, ml_codes(finite, E4M3))
    assert torch.equal(got, finite.to(torch.float8_e4m3fn).view(torch.uint8))


def test_ties_round_to_even():
    # 1.0625 lies halfway between 1.0 (0x38, even) and 1.125 (0x39): it rounds to 1.0.
    # 1.1875 lies halfway between 1.125 (odd) and 1.25 (0x3A, even): it rounds up.
    got = fp8.encode_e4m3(torch.tensor([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10]))
    assert got.tolist() == [0x38, 0x3A, 0x00, 0x02]


def test_saturation_and_nan():
    got = fp8.encode_e4m3(torch.tensor([1e9, -1e9, math.inf, -math.inf, math.nan, -math.nan]))
    assert got.tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7F]


def test_bfloat16_input_is_exact(gen):
    x = spread(gen, 4096).bfloat16()
    assert torch.equal(fp8.encode_e4m3(x), ml_codes(x.float().clamp(-448, 448), E4M3))


def test_decode_matches_ml_dtypes_for_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    got, want = fp8.decode_e4m3(codes), ml_values(codes, E4M3)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(got[keep], want[keep])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(canonical_e4m3_codes().tolist()), min_size=1, max_size=64))
def test_roundtrip_canonical_codes(codes):
    b = torch.tensor(codes, dtype=torch.uint8)
    assert torch.equal(fp8.encode_e4m3(fp8.decode_e4m3(b)), b)


def deepgemm_style_groups(x, group, ue8m0):
    """DeepGEMM's per-token cast (torch reference), written from its published formula."""
    g = x.float().reshape(*x.shape[:-1], -1, group)
    amax = g.abs().amax(-1).clamp(1e-4)
    sf = amax / 448.0
    if ue8m0:
        sf = torch.pow(2.0, torch.ceil(torch.log2(sf)))
    codes = (g / sf.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.reshape(x.shape), sf


@pytest.mark.parametrize("ue8m0", [False, True])
def test_groups_match_the_published_formula(gen, ue8m0):
    x = spread(gen, 16, 512)
    x[0] = 0.0  # all-zero groups: amax floor
    x[1, :128] = 3.5  # all-equal group
    codes, scales = fp8.quantize_fp8_groups(x, 128, ue8m0=ue8m0)
    want_codes, want_scales = deepgemm_style_groups(x, 128, ue8m0)
    assert torch.equal(scales, want_scales)
    assert torch.equal(codes, want_codes)
    assert scales.shape == (16, 4) and codes.dtype == torch.uint8


@pytest.mark.parametrize("ue8m0", [False, True])
def test_group_decode_error_is_within_half_an_e4m3_step(gen, ue8m0):
    x = spread(gen, 8, 256)
    codes, scales = fp8.quantize_fp8_groups(x, ue8m0=ue8m0)
    err = (fp8.dequantize_fp8_groups(codes, scales) - x).abs()
    # e4m3 has 3 mantissa bits: relative step 2^-3, half of it 2^-4; plus the subnormal floor.
    bound = x.abs() * 2.0**-4 + scales.repeat_interleave(128, -1) * 2.0**-10
    assert bool((err <= bound).all())


def test_ue8m0_scale_is_exact_ceiling_power_of_two():
    # amax / 448 = 2^-3 exactly stays 2^-3; one ulp more rounds up to 2^-2.
    x = torch.zeros(2, 128)
    x[0, 0] = 56.0
    x[1, 0] = torch.nextafter(torch.tensor(56.0), torch.tensor(100.0))
    _, scales = fp8.quantize_fp8_groups(x, ue8m0=True)
    assert scales.flatten().tolist() == [0.125, 0.25]


def test_block128_partial_tiles_match_per_tile_formula(gen):
    w = spread(gen, 200, 300)
    codes, scales = fp8.quantize_fp8_block128(w)
    assert codes.shape == (200, 300) and scales.shape == (2, 3)
    tile = w[128:200, 256:300]
    sf = tile.abs().amax().clamp(1e-4) / 448.0
    assert scales[1, 2].item() == sf.item()
    want = (tile / sf).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(codes[128:200, 256:300], want)
    back = fp8.dequantize_fp8_block128(codes, scales)
    assert torch.equal(back[128:200, 256:300], want.view(torch.float8_e4m3fn).float() * sf)


def test_per_tensor_roundtrip(gen):
    x = spread(gen, 1000)
    codes, scale = fp8.quantize_fp8_per_tensor(x)
    assert scale.dim() == 0 and torch.equal(scale, x.abs().max() / 448.0)
    err = (fp8.dequantize_fp8_per_tensor(codes, scale) - x).abs()
    assert bool((err <= x.abs() * 2.0**-4 + scale * 2.0**-10).all())


def test_nan_in_a_group_poisons_only_that_group():
    x = torch.ones(2, 128)
    x[0, 5] = math.nan
    codes, scales = fp8.quantize_fp8_groups(x)
    back = fp8.dequantize_fp8_groups(codes, scales)
    assert bool(torch.isnan(back[0]).all()) and not bool(torch.isnan(back[1]).any())


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: fp8.quantize_fp8_groups(torch.ones(3, 100)), "multiple of 128"),
        (lambda: fp8.quantize_fp8_groups(torch.ones(3, 128), group=0), "positive"),
        (lambda: fp8.quantize_fp8_groups(torch.ones(3, 128, dtype=torch.int32)), "float32"),
        (lambda: fp8.encode_e4m3(torch.ones(3, dtype=torch.int64)), "float32"),
        (lambda: fp8.decode_e4m3(torch.ones(3)), "uint8"),
        (
            lambda: fp8.dequantize_fp8_groups(
                torch.zeros(2, 256, dtype=torch.uint8), torch.ones(2, 3)
            ),
            "[2, 2]",
        ),
        (lambda: fp8.quantize_fp8_block128(torch.ones(4)), "[R, C]"),
        (
            lambda: fp8.dequantize_fp8_block128(
                torch.zeros(130, 10, dtype=torch.uint8), torch.ones(1, 1)
            ),
            "[2, 1]",
        ),
    ],
)
def test_bad_input_names_the_expected_shape(call, needle):
    with pytest.raises(ValueError, match=__import__("re").escape(needle)):
        call()
