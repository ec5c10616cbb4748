import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.formats import e8m0

from .conftest import E8M0, ml_codes, ml_values


def test_powers_of_two_match_ml_dtypes_and_torch():
    x = torch.exp2(torch.arange(-127, 128, dtype=torch.float32))
    got = e8m0.encode_e8m0(x)
    assert got.tolist() == list(range(255))
    assert torch.equal(got, ml_codes(x, E8M0))
    assert torch.equal(got, x.to(torch.float8_e8m0fnu).view(torch.uint8))


def test_zero_tiny_nan_and_inf():
    # Zero -> 0x00 as torch's float8_e8m0fnu cast (ml_dtypes gives NaN: documented divergence).
    x = torch.tensor([0.0, 1e-45, math.nan, math.inf])
    got = e8m0.encode_e8m0(x)
    assert got.tolist() == [0, 0, 255, 255]
    assert torch.equal(got, x.to(torch.float8_e8m0fnu).view(torch.uint8))


def test_decode_matches_ml_dtypes_for_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    got, want = e8m0.decode_e8m0(codes), ml_values(codes, E8M0)
    assert math.isnan(got[255].item()) and math.isnan(want[255].item())
    assert torch.equal(got[:255], want[:255])
    assert torch.equal(got[:255], codes[:255].view(torch.float8_e8m0fnu).float())


def test_reciprocal_is_exact():
    codes = torch.arange(255, dtype=torch.uint8)
    assert torch.equal(e8m0.pow2_reciprocal(codes) * e8m0.decode_e8m0(codes), torch.ones(255))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 254), min_size=1, max_size=32))
def test_roundtrip(codes):
    b = torch.tensor(codes, dtype=torch.uint8)
    assert torch.equal(e8m0.encode_e8m0(e8m0.decode_e8m0(b)), b)


@pytest.mark.parametrize("bad", [3.0, -1.0, 0.75, -math.inf])
def test_non_powers_of_two_are_refused(bad):
    with pytest.raises(ValueError, match="powers of two"):
        e8m0.encode_e8m0(torch.tensor([1.0, bad]))


def test_wrong_dtypes_are_refused():
    with pytest.raises(ValueError, match="uint8"):
        e8m0.decode_e8m0(torch.ones(3))
    with pytest.raises(ValueError, match="float32"):
        e8m0.encode_e8m0(torch.ones(3, dtype=torch.int32))
