"""indexer.logits_paged / logits_ragged Triton kernels against the reference (CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.index_keys import get_index_key_format
from hwrun.kernels.triton.indexer_logits import logits_paged
from hwrun.ops.indexer import logits_paged as reference_paged


def _paged_cache(fmt, num_blocks, block_size, g, alignment=1):
    """Random keys in pages of ``num_blocks`` blocks, each page 16 bytes short of its row, the
    row rounded up to ``alignment`` bytes (the layout planner aligns rows to 256)."""
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
    row = -(-(pages.shape[1] + 16) // alignment) * alignment
    padded = torch.zeros(num_blocks, row, dtype=torch.uint8)
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


def _poison_unread_keys(cache, fmt, table, lens, block_size):
    """0xFF bytes (NaN as e4m3 keys, fp32 scales and E8M0 codes) in every key slot past each
    request's longest row: a kernel that lets an unread key into a score shows NaN there. A TMA
    tile reads the whole page, so these slots reach its products and must be masked after them.
    """
    key_format = get_index_key_format(fmt)
    read = torch.zeros(cache.shape[0], block_size, dtype=torch.bool)
    for b, longest in enumerate(lens.amax(1).tolist()):
        for t in range(longest):
            read[table[b, t // block_size], t % block_size] = True
    elem_bytes = block_size * key_format.element_bytes
    cache[:, :elem_bytes].unflatten(1, (block_size, -1))[~read] = 0xFF
    cache[:, elem_bytes:].unflatten(1, (block_size, -1))[~read] = 0xFF


# Launch options of logits_paged beside the split grid's defaults. In the interpreter a
# multiprocessor count of 4 makes programs_per_sm=1 four programs, fewer than the nine key
# steps below (so programs loop over several, crossing requests); 16 gives programs with none.
PAGED_LAUNCHES = {
    "persistent": ("fp8", {"persistent": True, "programs_per_sm": 1}),
    "persistent_idle_programs": ("fp8", {"persistent": True, "programs_per_sm": 16}),
    "persistent_step2": ("fp8", {"persistent": True, "programs_per_sm": 1, "step": 2}),
    "tma": ("fp8", {"tma": True}),
    "persistent_tma": ("fp8", {"persistent": True, "programs_per_sm": 1, "tma": True}),
    "persistent_mxfp4": ("mxfp4", {"persistent": True, "programs_per_sm": 1}),
    "persistent_mxfp4_folded": (
        "mxfp4",
        {"persistent": True, "programs_per_sm": 1, "fold_groups": True},
    ),
}


@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.bfloat16])
@pytest.mark.parametrize("launch", sorted(PAGED_LAUNCHES))
def test_paged_launch_options_match_the_reference(launch, q_dtype):
    fmt, options = PAGED_LAUNCHES[launch]
    g = torch.Generator().manual_seed(sum(map(ord, launch)))
    batch, next_n, heads, block_size, max_blocks = 5, 2, 5, 16, 5
    num_blocks = batch * max_blocks + 3
    cache = _paged_cache(fmt, num_blocks, block_size, g, alignment=256)
    q = torch.randn(batch, next_n, heads, 128, generator=g).to(q_dtype)
    weights = torch.randn(batch * next_n, heads, generator=g)
    table = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].reshape(batch, -1)
    table = table.to(torch.int32)
    # Empty, one-token, partial-page and full rows; 9 key steps of 16 tokens in all, and a
    # max_ctx that ends inside a page.
    lens = torch.tensor([[40, 41], [0, 0], [1, 1], [17, 64], [0, 3]], dtype=torch.int32)
    for b, longest in enumerate(lens.amax(1).tolist()):
        table[b, -(-longest // block_size) :] = -1  # entries past a request's keys: never read
    max_ctx = 70
    _poison_unread_keys(cache, fmt, table, lens, block_size)
    got = logits_paged(q, weights, cache, fmt, table, lens, max_ctx, **options)
    want = reference_paged(q, weights, cache, fmt, table, lens, max_ctx)
    _assert_logits_close(got, want)
    # The same products in the same order as the split grid's: bitwise equal.
    same_products = {k: v for k, v in options.items() if k in ("step", "fold_groups")}
    split = logits_paged(q, weights, cache, fmt, table, lens, max_ctx, splits=3, **same_products)
    assert torch.equal(got, split)


@pytest.mark.parametrize("tma", [False, True])
def test_persistent_grid_without_keys_is_all_minus_inf(tma):
    g = torch.Generator().manual_seed(3)
    cache = _paged_cache("fp8", 4, 16, g, alignment=256)
    q = torch.randn(3, 1, 4, 128, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(3, 4, generator=g)
    table = torch.full((3, 2), -1, dtype=torch.int32)
    lens = torch.zeros(3, 1, dtype=torch.int32)
    got = logits_paged(q, weights, cache, "fp8", table, lens, 20, persistent=True, tma=tma)
    assert torch.equal(got, torch.full((3, 20), float("-inf")))


def test_paged_launch_options_refused_with_reasons():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 1, 4, 128, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(1, 4, generator=g)
    table = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, 1, dtype=torch.int32)
    mxfp4 = _paged_cache("mxfp4", 2, 16, g)  # rows of 16 * 68 + 16 B: not whole 128 B rows
    with pytest.raises(ValueError, match=r"fp8 key pages.*step=2.*multiple of 128"):
        logits_paged(q, weights, mxfp4, "mxfp4", table, lens, 16, step=2, tma=True)
    fp8 = _paged_cache("fp8", 2, 16, g)
    with pytest.raises(ValueError, match="multiple of 128"):
        logits_paged(q, weights, fp8, "fp8", table, lens, 16, tma=True)
    with pytest.raises(ValueError, match="leave splits unset"):
        logits_paged(q, weights, fp8, "fp8", table, lens, 16, splits=2, persistent=True)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_logits_ragged_matches_reference(fmt):
    from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged
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


def test_ragged_spans_keep_four_programs_a_multiprocessor():
    from hwrun.kernels.triton.indexer_logits_ragged import MAX_SPAN_TILES, default_tiles

    assert default_tiles(256, 1024, 132) == MAX_SPAN_TILES  # M=4096 N=16384, 4 rows a program
    assert default_tiles(64, 4, 132) == 1  # 16 query rows against 4096 keys: a tile a program
    spans = default_tiles(2048, 8, 132)  # 32 rows against 131072 keys
    assert 1 < spans < MAX_SPAN_TILES and -(-2048 // spans) * 8 >= 4 * 132


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.bfloat16])
@pytest.mark.parametrize("tiles", [1, 3, 8, None])
def test_logits_ragged_keeps_keys_no_row_scores_out(fmt, q_dtype, tiles):
    """Keys against a program's rows in one product: rows with windows that cut a tile at
    different columns (each row's columns outside its window are computed for its neighbours
    and must read -inf), an empty row, a partial last row group, and 0xFF bytes (NaN fp8 keys,
    NaN scales of both formats) in every key no row's window holds, whose products must not
    reach the output (masking by arithmetic, a score times 0, would let NaN through). With
    ``tiles`` key tiles a program (7 in all): spans whose first or last tiles lie outside
    every row's window (written as -inf unread), a last span cut short, one span for all."""
    from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged
    from hwrun.ops.indexer import logits_ragged as reference_ragged

    g = torch.Generator().manual_seed(12)
    rows, heads, num_keys = 11, 5, 200
    elements, scales = get_index_key_format(fmt).encode(torch.randn(num_keys, 128, generator=g))
    q = torch.randn(rows, heads, 128, generator=g).to(q_dtype)
    weights = torch.randn(rows, heads, generator=g)
    ks = torch.tensor([0, 3, 40, 40, 70, 0, 150, 150, 199, 64, 100], dtype=torch.int32)
    ke = torch.tensor([1, 60, 41, 90, 130, 0, 200, 151, 200, 128, 164], dtype=torch.int32)
    read = torch.zeros(num_keys, dtype=torch.bool)
    for start, end in zip(ks.tolist(), ke.tolist(), strict=True):
        read[start:end] = True
    elements, scales = elements.clone(), scales.clone()
    elements[~read], scales[~read] = 0xFF, 0xFF
    got = logits_ragged(q, weights, elements, scales, fmt, ks, ke, block_n=32, rows=4, tiles=tiles)
    want = reference_ragged(q, weights, elements, scales, fmt, ks, ke)
    assert not got.isnan().any()
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
    from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged
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
