"""indexer.logits_paged / logits_ragged Triton kernels against the reference (CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.index_keys import get_index_key_format
from hwrun.kernels.triton.indexer_logits import logits_paged
from hwrun.ops.indexer import logits_paged as reference_paged


def _paged_cache(fmt, num_blocks, block_size, g):
    key_format = get_index_key_format(fmt)
    keys = torch.randn(num_blocks * block_size, 128, generator=g) * 3
    elements, scales = key_format.encode(keys)
    pages = torch.cat(
        (
            elements.reshape(num_blocks, block_size * key_format.element_bytes),
            scales.reshape(num_blocks, block_size * key_format.scale_bytes),
        ),
        dim=1,
    )
    # A strided view, as a packed multi-layer cache hands it over: 16 spare bytes per block.
    padded = torch.zeros(num_blocks, pages.shape[1] + 16, dtype=torch.uint8)
    padded[:, : pages.shape[1]] = pages
    return padded[:, : pages.shape[1]]


def _assert_logits_close(got, want):
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), "-inf positions differ"
    assert torch.equal(got[~finite], want[~finite])
    err = (got[finite] - want[finite]).norm() / want[finite].norm().clamp(min=1e-30)
    assert err < 1e-5, err


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("q_dtype,step", [(torch.float8_e4m3fn, 1), (torch.bfloat16, 2)])
def test_logits_paged_matches_reference(fmt, q_dtype, step):
    g = torch.Generator().manual_seed(7)
    batch, next_n, heads, block_size, max_blocks, num_blocks = 3, 2, 5, 16, 4, 14
    cache = _paged_cache(fmt, num_blocks, block_size, g)
    q = torch.randn(batch, next_n, heads, 128, generator=g).to(q_dtype)
    weights = torch.randn(batch * next_n, heads, generator=g)
    table = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].reshape(batch, -1)
    table = table.to(torch.int32)
    table[2, 1:] = -1  # unallocated entries past a short request are never read
    lens = torch.tensor([[40, 41], [0, 64], [5, 6]], dtype=torch.int32)
    max_ctx = 70
    got = logits_paged(q, weights, cache, fmt, table, lens, max_ctx, splits=3, step=step)
    want = reference_paged(q, weights, cache, fmt, table, lens, max_ctx)
    _assert_logits_close(got, want)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_logits_ragged_matches_reference(fmt):
    from hwrun.kernels.triton.indexer_logits import logits_ragged
    from hwrun.ops.indexer import logits_ragged as reference_ragged

    g = torch.Generator().manual_seed(11)
    rows, heads, num_keys = 6, 3, 90
    key_format = get_index_key_format(fmt)
    elements, scales = key_format.encode(torch.randn(num_keys, 128, generator=g))
    q = torch.randn(rows, heads, 128, generator=g).to(torch.float8_e4m3fn)
    weights = torch.rand(rows, heads, generator=g)
    ks = torch.tensor([0, 0, 10, 30, 50, 90], dtype=torch.int32)
    ke = torch.tensor([0, 90, 40, 31, 90, 90], dtype=torch.int32)  # empty rows included
    got = logits_ragged(q, weights, elements, scales, fmt, ks, ke, block_n=32, rows=4)
    want = reference_ragged(q, weights, elements, scales, fmt, ks, ke)
    _assert_logits_close(got, want)
