import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
from torchao.prototype.mx_formats.utils import to_blocked

from hwrun.formats import nvfp4

from .conftest import spread


def cases(gen):
    x = torch.randn(32, 256, generator=gen) * 3
    x[0, :16] = 0.0  # all-zero block
    x[1, :16] = -1.25  # all-equal block
    x[2, :16] = torch.arange(16) * 0.5 - 4  # every code, ties included
    return x


@pytest.mark.parametrize("pow2_tensor_scale", [1.0, 64.0, 2.0**-3])
def test_two_level_matches_torchao(gen, pow2_tensor_scale):
    # With a power-of-two tensor scale torchao's division by per_tensor_scale and hwrun's
    # multiplication by tensor_scale are the same exact operation.
    x = cases(gen)[1:] * (1 / pow2_tensor_scale)  # torchao floors block scales at 2^-6
    packed, scales, ts = nvfp4.quantize_nvfp4(x, pow2_tensor_scale)
    ao_scales, ao_packed = nvfp4_quantize(x.contiguous(), 16, torch.tensor(1 / pow2_tensor_scale))
    assert ts.item() == pow2_tensor_scale
    assert torch.equal(scales, ao_scales.view(torch.uint8))
    assert torch.equal(packed, ao_packed.view(torch.uint8))


def test_default_tensor_scale_is_448_times_6_over_amax(gen):
    x = cases(gen)
    _, scales, ts = nvfp4.quantize_nvfp4(x)
    assert torch.equal(ts, torch.tensor(448.0 * 6.0) / x.abs().max())
    # the block holding the global amax gets the largest scale, 448 (e4m3 0x7E)
    assert scales.max().item() == 0x7E


def test_zero_tensor_and_zero_blocks():
    packed, scales, ts = nvfp4.quantize_nvfp4(torch.zeros(2, 32))
    assert ts.item() == 1.0 and scales.unique().tolist() == [1] and packed.unique().tolist() == [0]
    assert torch.equal(nvfp4.dequantize_nvfp4(packed, scales, ts), torch.zeros(2, 32))


@pytest.mark.parametrize("headroom", [1.0, 0.37])
def test_decode_error_bound(gen, headroom):
    x = spread(gen, 16, 128)
    packed, scales, ts = nvfp4.quantize_nvfp4(x, 448 * 6 / x.abs().max() * headroom)
    err = (nvfp4.dequantize_nvfp4(packed, scales, ts) - x).abs()
    block_amax = x.abs().reshape(16, 8, 16).amax(-1).repeat_interleave(16, -1)
    # block scale within 2^-4 of amax/6 (or its saturation/floor), half a top-binade step = s,
    # plus the e4m3 floor 2^-9 / ts for tiny blocks.
    s = nvfp4.decode_e4m3(scales).repeat_interleave(16, -1) / ts
    bound = torch.maximum(s, block_amax * (1.0625 / 6)) + 2.0**-9 / ts
    assert bool((err <= bound * 1.0001).all())


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_canonical_blocks_roundtrip(seed):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (4, 8), generator=g, dtype=torch.uint8)
    packed[:, 0] |= 0x7  # magnitude 6: the block's amax is 6 * scale
    scales = torch.randint(1, 0x7F, (4, 1), generator=g, dtype=torch.uint8)
    again = nvfp4.quantize_nvfp4(nvfp4.dequantize_nvfp4(packed, scales, 1.0), 1.0)
    assert torch.equal(again[0], packed) and torch.equal(again[1], scales)


@pytest.mark.parametrize(("rows", "cols"), [(128, 4), (200, 10), (1, 1), (300, 64)])
def test_swizzle_matches_torchao_to_blocked(rows, cols):
    m = torch.randint(
        0,
        256,
        (rows, cols),
        dtype=torch.uint8,
        generator=torch.Generator().manual_seed(rows * cols),
    )
    tiled = nvfp4.swizzle_128x4(m)
    assert torch.equal(tiled, to_blocked(m))
    assert torch.equal(nvfp4.unswizzle_128x4(tiled, rows, cols), m)


def test_swizzle_offsets_by_hand():
    m = torch.zeros(256, 8, dtype=torch.uint8)
    m[33, 2] = 1  # tile 0: (33 % 32) * 16 + (33 // 32) * 4 + 2 = 22
    m[130, 5] = 2  # tile (1, 1) = 3rd tile: 3 * 512 + 2 * 16 + 0 * 4 + 1 = 1569
    tiled = nvfp4.swizzle_128x4(m)
    assert tiled.nonzero().flatten().tolist() == [22, 1569]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: nvfp4.quantize_nvfp4(torch.ones(2, 24)), "multiple of 16"),
        (lambda: nvfp4.quantize_nvfp4(torch.ones(2, 16, dtype=torch.int32)), "float32"),
        (
            lambda: nvfp4.dequantize_nvfp4(
                torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8), 1.0
            ),
            "[2, 1]",
        ),
        (lambda: nvfp4.swizzle_128x4(torch.zeros(4, dtype=torch.uint8)), "[M, K]"),
        (lambda: nvfp4.unswizzle_128x4(torch.zeros(100, dtype=torch.uint8), 10, 2), "[512]"),
    ],
)
def test_bad_input_names_the_expected_shape(call, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        call()


def test_nan_block_decodes_to_nan():
    x = torch.ones(1, 32)
    x[0, 20] = math.nan
    packed, scales, ts = nvfp4.quantize_nvfp4(x, 1.0)
    back = nvfp4.dequantize_nvfp4(packed, scales, ts)
    assert bool(back[0, 16:].isnan().all()) and not bool(back[0, :16].isnan().any())


def test_a_nan_or_inf_costs_its_own_block_only(gen):
    x = torch.randn(4, 64, generator=gen)
    want_packed, want_scales, want_ts = nvfp4.quantize_nvfp4(x)
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[0, 20] = bad  # block 1 of row 0
        packed, scales, ts = nvfp4.quantize_nvfp4(y)
        assert ts == want_ts  # the tensor scale ignores non-finite values
        other = torch.ones_like(scales, dtype=torch.bool)
        other[0, 1] = False
        assert torch.equal(scales[other], want_scales[other])
        assert torch.equal(packed.reshape(4, 4, 8)[other], want_packed.reshape(4, 4, 8)[other])
        back = nvfp4.dequantize_nvfp4(packed, scales, ts)
        if math.isnan(bad):
            assert bool(back[0, 16:32].isnan().all())
        else:  # saturates to the tensor's largest finite magnitude, sign kept
            assert back[0, 20].item() == pytest.approx(math.copysign(6 * 448, bad) / ts.item())
            assert bool(back.isfinite().all())


@pytest.mark.parametrize("magnitude", [1e-30, 1e-35, 1e-37, 1e-39])
def test_tiny_tensors_keep_a_finite_scale_and_their_values(gen, magnitude):
    # 448 * 6 / amax overflowed fp32 below ~7.9e-36 and such tensors decoded to all zeros.
    x = torch.randn(2, 32, generator=gen) * magnitude
    packed, scales, ts = nvfp4.quantize_nvfp4(x)
    assert math.isfinite(ts.item()) and ts.item() <= nvfp4.MAX_TENSOR_SCALE
    back = nvfp4.dequantize_nvfp4(packed, scales, ts)
    error = ((back - x).abs().max() / x.abs().max()).item()
    assert error < (0.5 if magnitude < 1e-38 else 0.2), error  # fp32 subnormals lose bits
