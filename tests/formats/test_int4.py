import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchao.quantization.quant_primitives import (
    MappingType,
    choose_qparams_affine,
    quantize_affine,
)

from hwrun.formats import int4


def torchao_int4(w):
    scale, zero = choose_qparams_affine(
        w,
        MappingType.SYMMETRIC,
        (1, 128),
        torch.int8,
        quant_min=-8,
        quant_max=7,
        scale_dtype=torch.float32,
    )
    q = quantize_affine(w, (1, 128), scale, zero, torch.int8, -8, 7)
    return q, scale.reshape(w.shape[0], -1)


def unpack_as_int32_words(packed):
    """compressed-tensors' pack-quantized reading: little-endian int32, column 8k+i at 4i."""
    words = packed.numpy().copy().view("<u4")
    shifts = np.arange(8, dtype=np.uint32) * 4
    nibbles = (words[..., None] >> shifts) & 0xF
    return torch.from_numpy(nibbles.reshape(packed.shape[0], -1).astype(np.int16) - 8)


def test_matches_torchao_symmetric_and_compressed_tensors_packing(gen):
    w = torch.randn(48, 384, generator=gen)
    w[0, :128] = 0.0  # all-zero group
    w[1, :128] = 0.3  # all-equal group: 0.3 / (0.3 / 7.5) = 7.5 clips to 7
    w[2, :128] = torch.linspace(-1, 1, 128)
    w[3] *= 1e6
    packed, scales = int4.quantize_int4_g128(w)
    q, ao_scales = torchao_int4(w)
    assert torch.equal(scales, ao_scales)
    assert torch.equal(unpack_as_int32_words(packed), q.to(torch.int16))


def test_nibble_order_by_hand():
    w = torch.zeros(1, 128)
    w[0, 0], w[0, 1] = 7.5, -7.5  # scale 1: q = 7 (clipped) and -8
    packed, scales = int4.quantize_int4_g128(w)
    assert scales.item() == 1.0 and packed[0, 0].item() == (15 | (0 << 4))


def test_decode_error_bound(gen):
    w = torch.randn(16, 256, generator=gen)
    packed, scales = int4.quantize_int4_g128(w)
    err = (int4.dequantize_int4_g128(packed, scales) - w).abs()
    s = scales.repeat_interleave(128, -1)
    assert bool((err <= s / 2 * 1.0001).all())  # clipping at 7s is also within s / 2


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(-8, 8))
def test_codes_roundtrip_for_canonical_groups(seed, exponent):
    # Symmetric int4 never reproduces its own scale (amax is 7 or 8 steps, the rule divides by
    # 7.5). Canonical codes: a group led by q = 7 with every other q in [-6, 7]; then
    # q * 7.5 / 7 rounds back to q (7 * 7.5 / 7 = 7.5 clips to 7).
    g = torch.Generator().manual_seed(seed)
    nibbles = torch.randint(2, 16, (3, 128), generator=g, dtype=torch.uint8)  # q in [-6, 7]
    nibbles[:, 0] = 15
    packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    scales = torch.full((3, 1), 2.0**exponent)
    again_packed, again_scales = int4.quantize_int4_g128(int4.dequantize_int4_g128(packed, scales))
    assert torch.equal(again_packed, packed)
    assert torch.equal(again_scales, (scales * 7) / 7.5)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: int4.quantize_int4_g128(torch.ones(4, 100)), "multiple of 128"),
        (lambda: int4.quantize_int4_g128(torch.ones(2, 4, 128)), "[R, C]"),
        (lambda: int4.quantize_int4_g128(torch.full((1, 128), float("nan"))), "finite"),
        (
            lambda: int4.dequantize_int4_g128(
                torch.zeros(2, 64, dtype=torch.uint8), torch.ones(2, 2)
            ),
            "[2, 1]",
        ),
        (lambda: int4.dequantize_int4_g128(torch.zeros(2, 64), torch.ones(2, 1)), "uint8"),
    ],
)
def test_bad_input_names_the_expected_shape(call, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        call()
