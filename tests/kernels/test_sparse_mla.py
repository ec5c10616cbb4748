"""sparse_mla.decode and .prefill Triton kernels against the reference (CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from hwrun.formats.latent import FLT_MIN, get_latent_format
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.sparse_mla import _e4m3_times, decode, prefill
from hwrun.ops.sparse_mla import decode as reference
from hwrun.ops.sparse_mla import prefill as reference_prefill

# decode's optional launch variants, each against the reference on its own random inputs
VARIANTS = {
    "whole_rows": {"v_parts": 4},
    "bf16_position": {"bf16_position_dequant": True},
    "whole_rows_bf16_position": {"v_parts": 4, "bf16_position_dequant": True},
}
VARIANT_CASES = [  # bf16 rows hold no e4m3 codes
    (fmt, name)
    for fmt in ("fp8_ds_mla", "bf16")
    for name, launch in VARIANTS.items()
    if fmt == "fp8_ds_mla" or "bf16_position_dequant" not in launch
]


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_matches_reference(fmt, splits):
    _check_decode(fmt, splits, seed=3, heads=5)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize(("fmt", "variant"), VARIANT_CASES)
def test_decode_variants_match_reference(fmt, variant, splits):
    # 20 heads: a full block of 16 and a partial one.
    _check_decode(fmt, splits, seed=11 + splits, heads=20, **VARIANTS[variant])


def _check_decode(fmt, splits, seed, heads, **launch):
    g = torch.Generator().manual_seed(seed)
    batch, s, k, block_size, num_blocks = 2, 2, 40, 16, 6
    latent = get_latent_format(fmt)
    rows = latent.encode(
        torch.randn(num_blocks * block_size, 512, generator=g),
        torch.randn(num_blocks * block_size, 64, generator=g),
    )
    # A strided view: each block sits in a larger packed block (another layer's bytes after).
    packed = torch.zeros(num_blocks, block_size * latent.row_bytes + 64, dtype=torch.uint8)
    packed[:, : block_size * latent.row_bytes] = rows.reshape(num_blocks, -1)
    cache = packed[:, : block_size * latent.row_bytes].unflatten(1, (block_size, latent.row_bytes))
    q = torch.randn(batch, s, heads, 576, generator=g).to(torch.bfloat16)
    slots = torch.randint(0, num_blocks * block_size, (batch, s, k), generator=g, dtype=torch.int32)
    slots[0, 1, 5:] = -1
    slots[1, 0, :] = -1  # an empty row: out 0, lse -inf
    topk_length = torch.tensor([[40, 3], [10, 0]], dtype=torch.int32)
    sink = torch.randn(heads, generator=g)
    got_out, got_lse = decode(
        q,
        cache,
        fmt,
        slots,
        0.05,
        topk_length,
        sink,
        block_h=16,
        block_n=16,
        splits=splits,
        **launch,
    )
    want_out, want_lse = reference(q, cache, fmt, slots, 0.05, topk_length, sink)
    assert got_out.dtype == q.dtype and got_lse.dtype == torch.float32
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert torch.equal(got_out[1, 0], torch.zeros_like(got_out[1, 0]))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(got_lse[finite], want_lse[finite], atol=2e-2, rtol=0)
    torch.testing.assert_close(got_out.float(), want_out.float(), atol=4e-2, rtol=2e-2)


@triton.jit
def _decode_codes(codes_ptr, scales_ptr, out_ptr, ROWS: tl.constexpr):
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, 256)
    raw = tl.load(codes_ptr + n[:, None] * 256 + d[None, :])
    tile = _e4m3_times(raw, tl.load(scales_ptr + n), BF16_POSITION=True)
    tl.store(out_ptr + n[:, None] * 256 + d[None, :], tile)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on the inf and NaN scales
@pytest.mark.parametrize("rows_per_tile", [1, 16])  # 16: big and small scales share a tile
def test_bf16_position_decode_is_exact_for_every_code(rows_per_tile):
    # Every code (subnormals, +-0, NaN) times each scale: bit for bit as torch decodes it.
    scales = torch.tensor(
        [
            *(FLT_MIN, 2.0**-120, 1e-30, 1e-10),  # the format's floor; subnormal products
            *(1 / 448, 0.013, 1.0, 3.0, 255.0),
            *(255.9, 256.0, 1e6, 3e35),  # 255.9 rounds to 256 in bf16: scale * 2^120 overflows
            *(float("inf"), float("nan"), 0.0),
        ]
    )
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(len(scales), 1)
    out = torch.empty(codes.shape, dtype=torch.bfloat16)
    prepare_launch()
    _decode_codes[(len(scales) // rows_per_tile,)](codes, scales, out, ROWS=rows_per_tile)
    values = codes.view(torch.float8_e4m3fn).float()
    want = (values * scales.to(torch.bfloat16).float()[:, None]).to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    # Bit patterns: -0 stays -0, subnormals exact.
    assert torch.equal(out.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def _prefill_inputs(g, tokens, heads, k, workspace, kv_dtype):
    q = (torch.randn(tokens, heads, 576, generator=g) * 0.5).to(torch.bfloat16)
    kv = torch.randn(workspace, 576, generator=g).to(kv_dtype)
    indices = torch.randint(0, workspace, (tokens, k), generator=g, dtype=torch.int32)
    indices[torch.rand(tokens, k, generator=g) < 0.3] = -1  # -1 padding anywhere
    return q, kv, indices


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32])
def test_prefill_matches_reference(kv_dtype):
    g = torch.Generator().manual_seed(5)
    q, kv, indices = _prefill_inputs(g, 4, 10, 24, 50, kv_dtype)  # 10 heads: not a multiple of 16
    indices[0] = -1  # an empty row: out 0, lse -inf
    topk_length = torch.tensor([24, 20, 5, 0], dtype=torch.int32)  # rows shorter than k
    sink = torch.randn(10, generator=g)
    out, lse = prefill(q, kv, indices, 0.04, topk_length, sink)
    want_out, want_lse = reference_prefill(q, kv, indices, 0.04, topk_length, sink)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[3], out[0])
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[finite], want_lse[finite], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)


def test_prefill_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(6)
    q, kv, indices = _prefill_inputs(g, 3, 16, 40, 64, torch.bfloat16)
    out, lse = prefill(q, kv, indices, 0.04)
    for t in range(3):
        alone_out, alone_lse = prefill(q[t : t + 1], kv, indices[t : t + 1], 0.04)
        assert torch.equal(alone_out[0], out[t]) and torch.equal(alone_lse[0], lse[t])


def test_prefill_zero_tokens_and_one():
    g = torch.Generator().manual_seed(7)
    q, kv, indices = _prefill_inputs(g, 1, 16, 8, 16, torch.bfloat16)
    out, lse = prefill(q[:0], kv, indices[:0], 0.04)
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)
    out, lse = prefill(q, kv, indices, 0.04)
    want_out, want_lse = reference_prefill(q, kv, indices, 0.04)
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)
