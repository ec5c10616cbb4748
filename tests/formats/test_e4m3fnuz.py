"""E4M3 FNUZ (gfx942's fp8) byte-exact against ml_dtypes, and the e4m3fn -> FNUZ boundary
conversion exact over every code."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.formats import e4m3fnuz, fp8

from .conftest import E4M3FNUZ, ml_codes, ml_values

ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_decode_matches_ml_dtypes_for_every_code():
    got, want = e4m3fnuz.decode_e4m3fnuz(ALL_CODES), ml_values(ALL_CODES, E4M3FNUZ)
    assert torch.isnan(got).nonzero().flatten().tolist() == [0x80]
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(got[keep], want[keep])
    assert got[0x7F].item() == 240.0 and got[0x01].item() == 2.0**-10


def test_every_code_but_nan_round_trips():
    codes = ALL_CODES[ALL_CODES != 0x80]
    assert torch.equal(e4m3fnuz.encode_e4m3fnuz(e4m3fnuz.decode_e4m3fnuz(codes)), codes)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64))
def test_encode_matches_ml_dtypes_on_arbitrary_floats(values):
    x = torch.tensor(values, dtype=torch.float32)
    inside = x.clamp(-240, 240)  # ml_dtypes turns overflow into NaN; hwrun saturates
    assert torch.equal(e4m3fnuz.encode_e4m3fnuz(x), ml_codes(inside, E4M3FNUZ))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=64))
def test_encode_matches_ml_dtypes_on_arbitrary_bit_patterns(bits):
    # Every fp32 bit pattern, subnormals and NaN payloads included.
    x = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    got = e4m3fnuz.encode_e4m3fnuz(x)
    nan = torch.isnan(x)
    assert bool((got[nan] == 0x80).all())
    assert torch.equal(got[~nan], ml_codes(x[~nan].clamp(-240, 240), E4M3FNUZ))


def test_saturation_nan_and_no_negative_zero():
    x = torch.tensor([1e9, -1e9, math.inf, -math.inf, math.nan, -math.nan, -0.0, -(2.0**-12)])
    assert e4m3fnuz.encode_e4m3fnuz(x).tolist() == [0x7F, 0xFF, 0x7F, 0xFF, 0x80, 0x80, 0, 0]


def test_ties_round_to_even():
    # 1.0625 lies halfway between 1.0 (0x40, even) and 1.125 (0x41): it rounds to 1.0;
    # 3 * 2^-11 lies halfway between 2^-10 (0x01, odd) and 2^-9 (0x02): it rounds up.
    got = e4m3fnuz.encode_e4m3fnuz(torch.tensor([1.0625, 3 * 2.0**-11]))
    assert got.tolist() == [0x40, 0x02]


def test_boundary_conversion_halves_every_e4m3fn_value_exactly():
    converted = e4m3fnuz.fnuz_from_e4m3fn(ALL_CODES)
    ocp = fp8.decode_e4m3(ALL_CODES)
    got = e4m3fnuz.decode_e4m3fnuz(converted)
    assert torch.equal(torch.isnan(got), torch.isnan(ocp))  # NaN stays NaN (0x80)
    finite = ~torch.isnan(ocp)
    assert torch.equal(got[finite], ocp[finite] / 2)
    assert converted[0x80].item() == 0 and converted[0x7F].item() == 0x80


def test_negative_control_reading_e4m3fn_bits_as_fnuz_is_off_by_two():
    # What an adapter that skips the conversion (and the doubled scale) would compute.
    codes = torch.tensor([0x38, 0x7E], dtype=torch.uint8)  # e4m3fn 1.0 and 448
    assert e4m3fnuz.decode_e4m3fnuz(codes).tolist() == [0.5, 224.0]
