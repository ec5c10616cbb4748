"""dense.linear's and dense.linear_a8w8's Triton kernels against the references (CPU
interpreter, small shapes).

Tolerance: the kernel multiplies the same bf16 inputs (e4m3 codes exact in bf16), with exact
products and fp32 sums, but per tile and K step rather than one row at a time, and it scales a
128-wide partial sum where the reference rounds ``code * scale`` to fp32 first: the fp32 sums
differ in their last bits, which can move a bf16 output by one unit (2^-8 relative). Outputs
are compared to 4 bf16 units (rtol 2^-6) plus an atol of 1e-3 of the output's scale.
"""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.fp8 import quantize_fp8_groups
from hwrun.kernels.triton.activation_quant import quantize_activations
from hwrun.kernels.triton.linear import (
    DECODE_ROWS,
    INTERPRETER_TILES,
    PARTIAL_TRAFFIC_DIVISOR,
    LinearTiles,
    default_tiles,
    linear,
    linear_a8w8,
)
from hwrun.ops.linear import linear as reference
from hwrun.ops.linear import linear_a8w8 as reference_a8w8
from hwrun.ops.quantized_weight import QuantizedWeight, quantize_weight
from hwrun.registry import OpSpec

FORMATS = ["bf16", "fp8_block128", "fp8_block128_ue8m0"]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = float(want.float().abs().amax()) if want.numel() else 1.0
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-3 * scale)


def _problem(seed: int, fmt: str, tokens: int, rows: int, cols: int):
    g = torch.Generator().manual_seed(seed)
    weight = quantize_weight(torch.randn(rows, cols, generator=g) * 0.05, fmt, "w")
    return torch.randn(tokens, cols, generator=g).to(torch.bfloat16), weight


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("tokens", "rows", "cols"),
    [
        (1, 200, 256),  # one token (decode); R = 200 ends in a partial row block and tile
        (5, 160, 200),  # C = 200: a partial K step and a partial scale tile
    ],
)
def test_matches_reference(fmt, tokens, rows, cols):
    x, weight = _problem(21, fmt, tokens, rows, cols)
    _close(linear(x, weight), reference(x, weight))


@pytest.mark.parametrize(
    "tiles",
    [
        LinearTiles(16, 32, 32, split_k=3, num_stages=1),  # K split in three ranges, summed
        LinearTiles(16, 32, 64, split_k=2, swap_ab=True, num_stages=1),  # W @ x^T orientation
        LinearTiles(16, 16, 128, group_m=2, num_stages=1),  # 3 row blocks in groups of 2
        LinearTiles(32, 64, 128, split_k=4, swap_ab=True, group_m=1, num_stages=1),
        # 256 weight rows a tile: two scale rows, a scale per row (narrower tiles load one)
        LinearTiles(16, 256, 128, split_k=2, num_stages=1),
    ],
    ids=["split3", "swap_split2", "grouped", "swap_split4_wide", "two_scale_rows"],
)
def test_tile_configs_compute_the_same_op(tiles):
    # 40 rows: several row blocks; C = 384: three scale tiles, K steps within each.
    x, weight = _problem(22, "fp8_block128", 40, 150, 384)
    _close(linear(x, weight, tiles), reference(x, weight))


def test_split_ranges_never_straddle_the_end():
    # 5 K steps of 32 in 3 requested ranges: 2 + 2 + 1 steps, the last one partial (C = 150).
    x, weight = _problem(23, "fp8_block128_ue8m0", 3, 64, 150)
    tiles = LinearTiles(16, 32, 32, split_k=3, num_stages=1)
    _close(linear(x, weight, tiles), reference(x, weight))


@pytest.mark.parametrize("fmt", ["fp8_block128", "fp8_block128_ue8m0"])
def test_zero_tiny_and_large_scales(fmt):
    x, weight = _problem(24, fmt, 3, 256, 384)
    scales = weight.scales.clone()
    if fmt == "fp8_block128":
        scales[0, 0], scales[0, 1], scales[1, 2] = 0.0, 2.0**20, 2.0**-30
    else:  # e8m0 codes: 0 is 2^-127, 254 is 2^127 (kept finite by zero codes), 147 is 2^20
        scales[0, 0], scales[0, 1], scales[1, 2] = 0, 147, 254
    data = weight.data.clone()
    if fmt.endswith("ue8m0"):
        data[128:, 256:] = 0  # the 2^127 tile: zero codes, so the products stay finite
    weight = QuantizedWeight(fmt, weight.shape, data, scales, name="w")
    got, want = linear(x, weight), reference(x, weight)
    assert torch.isfinite(want.float()).all()
    _close(got, want)


@pytest.mark.parametrize("fmt", ["fp8_block128", "fp8_block128_ue8m0"])
@pytest.mark.parametrize(
    "tiles",
    [
        LinearTiles(16, 32, 64, num_stages=1, f16_products=True),
        LinearTiles(16, 32, 32, split_k=3, swap_ab=True, num_stages=1, f16_products=True),
    ],
    ids=["plain", "swap_split3"],
)
def test_f16_products_match_the_reference_across_the_bf16_range(fmt, tiles):
    # x goes to f16 with a power-of-two scale per row and 128 columns: rows far outside f16's
    # range, 24 decades inside one row and a zero row must all match (C = 200: a partial
    # group).
    x, weight = _problem(28, fmt, 6, 96, 200)
    x = x.float()
    x[1] *= 1e30
    x[2] *= 1e-30
    x[3] *= torch.logspace(-12, 12, x.shape[1])
    x[4] = 0
    x = x.to(torch.bfloat16)
    got, want = linear(x, weight, tiles), reference(x, weight)
    assert torch.isfinite(want.float()).all()
    for row in range(x.shape[0]):  # rows 60 decades apart: each at its own scale
        _close(got[row : row + 1], want[row : row + 1])


def test_f16_products_leave_bf16_weights_on_the_bf16_path():
    x, weight = _problem(29, "bf16", 3, 64, 128)
    tiles = LinearTiles(16, 32, 32, num_stages=1, f16_products=True)
    _close(linear(x, weight, tiles), reference(x, weight))


def test_no_rows():
    x, weight = _problem(25, "fp8_block128", 0, 64, 128)
    assert linear(x, weight).shape == (0, 64)


def test_negative_control_the_scale_tile_matters():
    # The same codes under transposed scale tiles are another weight: the kernel must not match
    # the reference on the original, so the tests above can fail.
    x, weight = _problem(26, "fp8_block128", 4, 256, 256)
    want = reference(x, weight)
    scales = weight.scales.T.contiguous() * torch.tensor([[1.0, 3.0], [0.5, 1.0]])
    swapped = QuantizedWeight(weight.format, weight.shape, weight.data, scales, name="w")
    assert not torch.allclose(linear(x, swapped).float(), want.float(), rtol=2**-6, atol=1e-3)


def test_refuses_what_it_cannot_compute():
    x, weight = _problem(27, "fp8_block128", 2, 64, 128)
    with pytest.raises(ValueError, match=r"x is torch\.float32"):
        linear(x.float(), weight)
    with pytest.raises(ValueError, match="block_k 256 must divide the fp8 scale tile 128"):
        linear(x, weight, LinearTiles(16, 32, 256))
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16, got 24"):
        linear(x, weight, LinearTiles(16, 24, 32))
    with pytest.raises(ValueError, match=r"C must agree"):
        linear(x[:, :64], weight)
    mxfp4 = quantize_weight(torch.randn(64, 128), "mxfp4", "w")
    with pytest.raises(ValueError, match=r"weight \(w\) is mxfp4; dense.linear takes"):
        linear(x, mxfp4)


def test_default_tiles_split_decode_rows_across_the_device():
    sms = 132
    for rows, cols in [(576, 4096), (1536, 4096), (4096, 8192), (12288, 1536)]:
        tiles = default_tiles(1, rows, cols, sms)
        programs = -(-rows // tiles.block_n) * tiles.split_k
        assert tiles.block_m == 16 and programs >= sms, (rows, cols, tiles)
        assert -(-cols // tiles.block_k) >= 2 * tiles.split_k  # at least 2 K steps per range
    wide = default_tiles(8, 129280, 4096, sms)  # the LM head fills the device unsplit
    assert wide.split_k == 1
    # At 64 rows the fp32 partials would soon cost more traffic than the weight: capped.
    cap = 4096 // (PARTIAL_TRAFFIC_DIVISOR * DECODE_ROWS)
    assert default_tiles(DECODE_ROWS, 576, 4096, sms).split_k <= cap
    # Splits are powers of two (5 ranges of o_proj's 64 K steps were 40% slower than 4).
    for rows in (1, 8, 64):
        split = default_tiles(rows, 4096, 8192, sms).split_k
        assert split & (split - 1) == 0, (rows, split)
    assert default_tiles(0, 576, 4096, sms).split_k >= 1  # no rows: any valid tiles
    prefill = default_tiles(512, 4096, 8192, sms)
    assert prefill.split_k == 1 and prefill.block_m == 128
    assert default_tiles(512, 4096, 8192, None) == INTERPRETER_TILES


def test_the_triton_tier_registers_it_graph_safe_and_not_batch_invariant(monkeypatch):
    from hwrun.kernels.triton.registration import FAMILIES

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = next(k for family in FAMILIES.values() for k in family if k.op == "dense.linear")
    assert kernel.graph_safe and not kernel.batch_invariant
    assert set(kernel.formats) == set(FORMATS)
    fp8 = OpSpec("dense.linear", "bfloat16", ("fp8_block128", "bf16"), device_type="cuda")
    assert kernel.limits(fp8) == [] and kernel.reads_e4m3fn(fp8)
    refused = " | ".join(kernel.limits(OpSpec("dense.linear", "float32", ("mxfp4",))))
    assert "input dtype float32" in refused and "['mxfp4'] not supported" in refused


# -- dense.linear_a8w8: the activation quantizer, then e4m3 x e4m3 --------------------------------


@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32_scales", "ue8m0_scales"])
def test_the_activation_quantizer_is_byte_exact(ue8m0):
    g = torch.Generator().manual_seed(30)
    x = (torch.randn(7, 384, generator=g) * 5).to(torch.bfloat16)  # 3 groups: not a power of 2
    x[0, :128] = 0  # amax floor
    x[1, 200] = 30000.0  # an outlier beside ordinary values
    x[2, 256:] = torch.randn(128, generator=g).to(torch.bfloat16) * 1e-6  # subnormal codes
    wide = torch.cat([x, x * 0.5, -x], dim=1)  # 9 groups: two programs a row, one part full
    for rows in (x, wide):
        codes, scales = quantize_activations(rows, ue8m0)
        want_codes, want_scales = quantize_fp8_groups(rows.float(), 128, ue8m0=ue8m0)
        assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    assert quantize_activations(x[:0], ue8m0)[0].shape == (0, 384)
    with pytest.raises(ValueError, match="C a multiple of 128"):
        quantize_activations(x[:, :200], ue8m0)


def test_the_activation_quantizer_lays_scales_out_tokens_first():
    """token_major_scales: the same values in DeepGEMM's SM90 layout, strides (1, T rounded up
    to 4), the padding columns never read back."""
    g = torch.Generator().manual_seed(31)
    for tokens in (1, 5, 8):
        x = (torch.randn(tokens, 1152, generator=g) * 3).to(torch.bfloat16)  # 9 groups
        codes, scales = quantize_activations(x, False, token_major_scales=True)
        want_codes, want_scales = quantize_fp8_groups(x.float(), 128)
        assert scales.shape == (tokens, 9) and scales.stride() == (1, -(-tokens // 4) * 4)
        assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)


@pytest.mark.parametrize("fmt", ["fp8_block128", "fp8_block128_ue8m0"])
@pytest.mark.parametrize(
    "tiles",
    [
        None,  # the interpreter's defaults with 128-wide K steps
        LinearTiles(16, 32, 128, split_k=2, swap_ab=True, num_stages=1),
        LinearTiles(16, 16, 128, split_k=3, group_m=2, num_stages=1),
        # tensor descriptors: the partial row block, weight rows past N, a split range
        LinearTiles(16, 32, 128, split_k=2, num_stages=1, tma=True),
        LinearTiles(32, 64, 128, num_stages=1, tma=True),
        LinearTiles(16, 256, 128, split_k=3, num_stages=1),  # two scale rows a tile
    ],
    ids=["default", "swap_split2", "split3_grouped", "tma_split2", "tma_wide", "two_scale_rows"],
)
def test_a8w8_matches_reference(fmt, tiles):
    x, weight = _problem(31, fmt, 20, 150, 384)  # partial row block and scale tile, 3 K steps
    x[3, 130] = 500.0
    _close(linear_a8w8(x, weight, tiles), reference_a8w8(x, weight))


@pytest.mark.parametrize("token_major", [False, True], ids=["row_major", "token_major"])
@pytest.mark.parametrize(
    "tiles",
    [None, LinearTiles(16, 32, 128, split_k=2, swap_ab=True, num_stages=1)],
    ids=["default", "swap_split2"],
)
def test_a8w8_reads_given_codes_and_scales_in_any_layout(token_major, tiles):
    """``quantized``: the codes and scales the norm kernel wrote (rows first, or tokens first
    as DeepGEMM reads them) give the same bits as the kernel's own quantizer; the kernel reads
    them, not x (codes of another x change the result)."""
    x, weight = _problem(35, "fp8_block128", 20, 150, 384)
    codes, scales = quantize_activations(x, False, token_major_scales=token_major)
    assert scales.is_contiguous() != token_major
    own = linear_a8w8(x, weight, tiles)
    assert torch.equal(linear_a8w8(x, weight, tiles, quantized=(codes, scales)), own)
    other = quantize_activations(x.flip(0), False, token_major_scales=token_major)
    assert not torch.equal(linear_a8w8(x, weight, tiles, quantized=other), own)


def test_a8w8_refuses_quantized_rows_of_another_shape():
    x, weight = _problem(36, "fp8_block128", 4, 64, 256)
    codes, scales = quantize_activations(x, False)
    with pytest.raises(ValueError, match=r"quantized scales must be torch.float32 \[4, 2\]"):
        linear_a8w8(x, weight, quantized=(codes, scales[:, :1]))
    with pytest.raises(ValueError, match=r"quantized codes must be torch\.uint8"):
        linear_a8w8(x, weight, quantized=(codes.float(), scales))
    with pytest.raises(ValueError, match=r"quantized must be \(codes, scales\)"):
        linear_a8w8(x, weight, quantized=(codes,))


def test_a8w8_negative_control_and_refusals():
    x, weight = _problem(32, "fp8_block128", 4, 64, 256)
    # The bf16 product is another op: this kernel must not be matching it by accident.
    assert not torch.equal(linear_a8w8(x, weight), reference(x, weight))
    with pytest.raises(ValueError, match="block_k 64 must be 128: one activation scale"):
        linear_a8w8(x, weight, LinearTiles(16, 32, 64))
    with pytest.raises(ValueError, match=r"dense.linear_a8w8: weight \(w\) is bf16"):
        linear_a8w8(x, quantize_weight(torch.randn(64, 256), "bf16", "w"))
    assert linear_a8w8(x[:0], weight).shape == (0, 64)
    with pytest.raises(ValueError, match="tma reads e4m3 tiles on both sides"):
        linear(x, weight, LinearTiles(16, 32, 128, tma=True))
    with pytest.raises(ValueError, match="tma reads e4m3 tiles on both sides"):
        linear_a8w8(x, weight, LinearTiles(16, 32, 128, swap_ab=True, tma=True))
