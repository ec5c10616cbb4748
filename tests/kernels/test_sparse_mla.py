"""sparse_mla.decode and .prefill Triton kernels against the reference (CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.latent import get_latent_format
from hwrun.kernels.triton.sparse_mla import decode, prefill
from hwrun.ops.sparse_mla import decode as reference
from hwrun.ops.sparse_mla import prefill as reference_prefill


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_matches_reference(fmt, splits):
    g = torch.Generator().manual_seed(3)
    batch, s, heads, k, block_size, num_blocks = 2, 2, 5, 40, 16, 6
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
        q, cache, fmt, slots, 0.05, topk_length, sink, block_h=16, block_n=16, splits=splits
    )
    want_out, want_lse = reference(q, cache, fmt, slots, 0.05, topk_length, sink)
    assert got_out.dtype == q.dtype and got_lse.dtype == torch.float32
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert torch.equal(got_out[1, 0], torch.zeros_like(got_out[1, 0]))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(got_lse[finite], want_lse[finite], atol=2e-2, rtol=0)
    torch.testing.assert_close(got_out.float(), want_out.float(), atol=4e-2, rtol=2e-2)


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
