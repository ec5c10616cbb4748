"""Hypothesis: decoding stays within each format's error bound, at any magnitude."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx

from hwrun.formats import fp8, int4, mxfp4, nvfp4
from hwrun.formats.e8m0 import decode_e8m0
from hwrun.formats.index_keys import get_index_key_format

from .conftest import E2M1, E4M3, ml_codes

SEEDS = st.integers(0, 2**31)
EXPONENTS = st.integers(-30, 30)


def data(seed: int, exponent: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2.0**exponent


@settings(max_examples=25, deadline=None)
@given(SEEDS, EXPONENTS, st.booleans())
def test_fp8_groups(seed, exponent, ue8m0):
    x = data(seed, exponent, 4, 256)
    codes, scales = fp8.quantize_fp8_groups(x, ue8m0=ue8m0)
    err = (fp8.dequantize_fp8_groups(codes, scales) - x).abs()
    # relative half step of e4m3 (2^-4) or half the smallest subnormal step times the scale
    assert bool((err <= x.abs() * 2.0**-4 + scales.repeat_interleave(128, -1) * 2.0**-10).all())


@settings(max_examples=25, deadline=None)
@given(SEEDS, EXPONENTS, st.sampled_from(mxfp4.SCALE_RULES))
def test_mxfp4(seed, exponent, rule):
    x = data(seed, exponent, 4, 128)
    packed, scales = mxfp4.quantize_mxfp4(x, rule)
    err = (mxfp4.dequantize_mxfp4(packed, scales) - x).abs()
    s = decode_e8m0(scales).repeat_interleave(32, -1)
    # half of the top step (2s) is s; FLOOR may also clip amax < 8s to 6s (error < 2s)
    assert bool((err <= s * (2 if rule == "floor" else 1)).all())


@settings(max_examples=25, deadline=None)
@given(SEEDS, st.integers(-10, 30))
def test_nvfp4(seed, exponent):
    x = data(seed, exponent, 4, 128)
    packed, scales, ts = nvfp4.quantize_nvfp4(x)
    err = (nvfp4.dequantize_nvfp4(packed, scales, ts) - x).abs()
    s = nvfp4.decode_e4m3(scales).repeat_interleave(16, -1) / ts
    block_amax = x.abs().reshape(4, 8, 16).amax(-1).repeat_interleave(16, -1)
    assert bool((err <= torch.maximum(s, block_amax * (1.0625 / 6)) * 1.0001 + 2.0**-9 / ts).all())


@settings(max_examples=25, deadline=None)
@given(SEEDS, EXPONENTS)
def test_int4(seed, exponent):
    w = data(seed, exponent, 4, 256)
    packed, scales = int4.quantize_int4_g128(w)
    err = (int4.dequantize_int4_g128(packed, scales) - w).abs()
    assert bool((err <= scales.repeat_interleave(128, -1) * 0.5 * 1.0001).all())


@settings(max_examples=25, deadline=None)
@given(SEEDS, st.integers(-12, 30))
def test_mxfp4_index_keys(seed, exponent):
    k = data(seed, exponent, 8, 128)
    f = get_index_key_format("mxfp4")
    elements, scales = f.encode(k)
    err = (f.decode(elements, scales) - k).abs()
    s = decode_e8m0(scales).repeat_interleave(32, -1)
    assert bool((err <= s).all())  # never saturates: at most half the top step


def test_chunked_encoders_match_ml_dtypes_and_torchao_across_chunk_boundaries():
    # 1.5M elements spans two of the encoders' 1M-element chunks.
    x = data(7, 0, 3 * 2**19) * 3
    assert torch.equal(mxfp4.encode_e2m1(x), ml_codes(x, E2M1))
    blocks = x.reshape(-1, 4096)
    packed, scales = mxfp4.quantize_mxfp4(blocks)
    ao_scales, ao_packed = to_mx(blocks, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    assert torch.equal(scales, ao_scales.view(torch.uint8))
    assert torch.equal(packed, ao_packed.view(torch.uint8))
    back = mxfp4.dequantize_mxfp4(packed, scales)
    assert back.shape == blocks.shape and bool(torch.isfinite(back).all())


FLOAT32S = st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64)


@settings(max_examples=60, deadline=None)
@given(FLOAT32S)
def test_any_float32_encodes_like_ml_dtypes_e4m3(values):
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(fp8.encode_e4m3(x), ml_codes(x.clamp(-448, 448), E4M3))


@settings(max_examples=60, deadline=None)
@given(FLOAT32S)
def test_any_float32_encodes_like_ml_dtypes_e2m1(values):
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(mxfp4.encode_e2m1(x), ml_codes(x, E2M1))
