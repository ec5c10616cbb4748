"""sparse_mla.decode Triton kernel against the reference (CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.latent import get_latent_format
from hwrun.kernels.triton.sparse_mla import decode
from hwrun.ops.sparse_mla import decode as reference


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
