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


def _mxfp4_keys_with_spread_scales(num_keys, g):
    """mxfp4 keys whose group exponents cover the folded path's edges: spreads of 0 to 5 (one
    K=128 product), 7 (the four products), a NaN code within and beyond the fold's reach, and
    an all-zero key."""
    elements, scales = get_index_key_format("mxfp4").encode(torch.randn(num_keys, 128, generator=g))
    scales = scales.clone()
    scales[0] = torch.tensor([127, 127, 127, 127], dtype=torch.uint8)  # spread 0
    scales[1] = torch.tensor([122, 127, 124, 126], dtype=torch.uint8)  # spread 5: folds exactly
    scales[2] = torch.tensor([0, 3, 5, 1], dtype=torch.uint8)  # the smallest codes
    scales[3] = torch.tensor([255, 254, 252, 253], dtype=torch.uint8)  # NaN, folded
    elements[4] = 0  # zero key
    scales[20] = torch.tensor([120, 127, 127, 125], dtype=torch.uint8)  # spread 7: 4 products
    scales[21] = torch.tensor([255, 10, 127, 127], dtype=torch.uint8)  # NaN, unfolded
    return elements, scales


def _assert_logits_close_with_nan(got, want):
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ"
    _assert_logits_close(got.masked_fill(nan, 0.0), want.masked_fill(nan, 0.0))


@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_folded_mxfp4_groups_match_the_reference(q_dtype):
    from hwrun.kernels.triton.indexer_logits import logits_ragged
    from hwrun.ops.indexer import logits_ragged as reference_ragged

    g = torch.Generator().manual_seed(5)
    rows, heads, num_keys = 4, 3, 40  # tiles of 16 keys: the first folds, the second does not
    elements, scales = _mxfp4_keys_with_spread_scales(num_keys, g)
    q = torch.randn(rows, heads, 128, generator=g).to(q_dtype)
    weights = torch.rand(rows, heads, generator=g)
    ks = torch.tensor([0, 0, 5, 17], dtype=torch.int32)
    ke = torch.tensor([40, 16, 33, 40], dtype=torch.int32)
    want = reference_ragged(q, weights, elements, scales, "mxfp4", ks, ke)
    for fold in (False, True):
        got = logits_ragged(
            q, weights, elements, scales, "mxfp4", ks, ke, block_n=16, fold_groups=fold
        )
        _assert_logits_close_with_nan(got, want)
    assert torch.isnan(want[0, 3]) and torch.isnan(want[0, 21])  # both NaN paths are reached


def test_folded_mxfp4_groups_in_the_paged_kernel():
    g = torch.Generator().manual_seed(9)
    batch, heads, block_size, num_blocks = 2, 4, 16, 6
    elements, scales = _mxfp4_keys_with_spread_scales(num_blocks * block_size, g)
    cache = torch.cat(
        (elements.reshape(num_blocks, -1), scales.reshape(num_blocks, -1)), dim=1
    ).contiguous()
    q = torch.randn(batch, 1, heads, 128, generator=g).to(torch.float8_e4m3fn)
    weights = torch.rand(batch, heads, generator=g)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([[45], [30]], dtype=torch.int32)
    want = reference_paged(q, weights, cache, "mxfp4", table, lens, 48)
    got = logits_paged(q, weights, cache, "mxfp4", table, lens, 48, splits=2, fold_groups=True)
    _assert_logits_close_with_nan(got, want)
