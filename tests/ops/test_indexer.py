"""indexer.logits_ragged / .logits_paged against the plain formula (DeepGEMM's meaning)."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.index_keys import INDEX_KEY_FORMATS
from hwrun.ops import indexer, kv_write

INF = float("inf")
FORMATS = sorted(INDEX_KEY_FORMATS)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _formula(q, weights, keys, lengths_or_ranges):
    """out[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j]) in float64, -inf outside each range."""
    scores = torch.einsum("mhd,nd->mhn", q.double(), keys.double()).relu()
    out = (scores * weights.double()[:, :, None]).sum(1)
    column = torch.arange(keys.shape[0])
    starts, ends = lengths_or_ranges
    inside = (column >= starts[:, None]) & (column < ends[:, None])
    return out.masked_fill(~inside, -INF)


def _assert_logits_close(out, ref):
    assert out.dtype == torch.float32
    assert torch.equal(out == -INF, ref == -INF)  # -inf positions exactly
    finite = ref != -INF
    torch.testing.assert_close(out[finite].double(), ref[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ragged_matches_the_formula_on_decoded_keys(fmt):
    # 24 query rows, 7 heads (not a multiple of 16), 53 keys, CP-style ranges incl. empty ones.
    key_format = INDEX_KEY_FORMATS[fmt]
    q, keys = _randn(24, 7, 128, seed=1).bfloat16(), _randn(53, 128, seed=2)
    weights = _randn(24, 7, seed=3)
    elements, scales = key_format.encode(keys)
    ks = torch.randint(0, 30, (24,), generator=torch.Generator().manual_seed(4)).int()
    ke = (ks + torch.arange(24) % 23).clamp(max=53).int()
    ke[5] = ks[5]  # an empty row
    out = indexer.logits_ragged(q, weights, elements, scales, fmt, ks, ke)
    decoded = key_format.decode(elements, scales)
    _assert_logits_close(out, _formula(q.float(), weights, decoded, (ks, ke)))
    assert bool((out[5] == -INF).all())


@pytest.mark.parametrize("fmt", FORMATS)
def test_paged_next_n_rows_match_deepgemm_lengths(fmt):
    key_format = INDEX_KEY_FORMATS[fmt]
    batch, next_n, heads, block_size, num_blocks = 3, 3, 5, 16, 12
    lens = torch.tensor([37, 3, 70], dtype=torch.int32)  # non-powers of two; 3 == next_n
    max_ctx = 75
    # A page cache inside a wider buffer (strided view), pages in shuffled order.
    width = block_size * key_format.bytes_per_token
    buffer = torch.full((num_blocks, width + 40), 0xAB, dtype=torch.uint8)
    cache = buffer[:, :width]
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(5)).int()
    table = torch.stack([order[0:5], order[5:7].repeat(3)[:5], order[7:12]])
    keys = [_randn(int(n), 128, seed=10 + b) for b, n in enumerate(lens)]
    for b, n in enumerate(lens.tolist()):
        tokens = torch.arange(n)
        slots = table[b].long()[tokens // block_size] * block_size + tokens % block_size
        kv_write.write_index_keys(cache, keys[b], slots.int(), fmt)
    q = _randn(batch, next_n, heads, 128, seed=6).bfloat16()
    weights = _randn(batch * next_n, heads, seed=7)
    context = indexer.next_n_context_lens(lens, next_n)
    assert context.tolist() == [[35, 36, 37], [1, 2, 3], [68, 69, 70]]
    out = indexer.logits_paged(q, weights, cache, fmt, table, context, max_ctx)
    assert out.shape == (batch * next_n, max_ctx)
    for b in range(batch):
        decoded = key_format.decode(*key_format.encode(keys[b]))
        decoded = torch.cat([decoded, torch.zeros(max_ctx - decoded.shape[0], 128)])
        rows = slice(b * next_n, (b + 1) * next_n)
        # DeepGEMM's 1-D form: row j sees keys at positions <= len - next_n + j.
        ends = lens[b] - next_n + torch.arange(next_n) + 1
        ref = _formula(q[b].float(), weights[rows], decoded, (torch.zeros(next_n), ends))
        _assert_logits_close(out[rows], ref)


def test_fp8_query_with_its_scale_folded_into_the_weights():
    q = _randn(6, 4, 128, seed=8)
    q_scale = q.abs().amax(-1) / 448.0  # per (token, head)
    codes = (q / q_scale[..., None]).to(torch.float8_e4m3fn)
    weights = _randn(6, 4, seed=9)
    elements, scales = INDEX_KEY_FORMATS["fp8"].encode(_randn(11, 128, seed=10))
    ks, ke = torch.zeros(6, dtype=torch.int32), torch.full((6,), 11, dtype=torch.int32)
    folded = indexer.fold_q_scale(q_scale, weights)
    out = indexer.logits_ragged(codes, folded, elements, scales, "fp8", ks, ke)
    dequantized = codes.float() * q_scale[..., None]
    ref = indexer.logits_ragged(dequantized, weights, elements, scales, "fp8", ks, ke)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="q_scale must be positive"):
        indexer.fold_q_scale(q_scale * 0, weights)
    with pytest.raises(ValueError, match="same shape"):
        indexer.fold_q_scale(q_scale[:, :2], weights)


def test_rows_with_zero_length_and_a_zero_width_call():
    cache = torch.zeros(2, 4 * 132, dtype=torch.uint8)
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    q, weights = torch.ones(2, 1, 3, 128), torch.ones(2, 3)
    lens = torch.tensor([[0], [4]], dtype=torch.int32)
    out = indexer.logits_paged(q, weights, cache, "fp8", table, lens, 6)
    assert bool((out[0] == -INF).all()) and bool((out[1, 4:] == -INF).all())
    assert bool((out[1, :4] == 0).all())  # zero keys score exactly 0
    empty = indexer.logits_paged(q, weights, cache, "fp8", table, lens * 0, 0)
    assert empty.shape == (2, 0)


def _ragged_args(**changes):
    elements, scales = INDEX_KEY_FORMATS["fp8"].encode(torch.ones(5, 128))
    args = {
        "q": torch.zeros(2, 3, 128),
        "weights": torch.zeros(2, 3),
        "key_elements": elements,
        "key_scales": scales,
        "fmt": "fp8",
        "ks": torch.zeros(2, dtype=torch.int32),
        "ke": torch.full((2,), 5, dtype=torch.int32),
    }
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"q": torch.zeros(2, 3, 64)}, "head dim must be 128"),
        ({"q": torch.zeros(2, 3, 128, dtype=torch.int8)}, "q must be bfloat16"),
        (
            {"weights": torch.zeros(2, 3, dtype=torch.bfloat16)},
            "weights must be float32 \\[2, 3\\]",
        ),
        ({"weights": torch.zeros(3, 2)}, "weights must be float32 \\[2, 3\\]"),
        ({"key_scales": torch.zeros(5, 2, dtype=torch.uint8)}, "key_scales must be uint8"),
        ({"key_elements": torch.zeros(5, 64, dtype=torch.uint8)}, "key_elements must be uint8"),
        ({"fmt": "fp4"}, "unknown index key format"),
        ({"ke": torch.tensor([5, 6], dtype=torch.int32)}, "ks <= ke <= N=5"),
        (
            {
                "ks": torch.tensor([3, 0], dtype=torch.int32),
                "ke": torch.tensor([2, 5], dtype=torch.int32),
            },
            "ks <= ke",
        ),
        ({"ks": torch.zeros(3, dtype=torch.int32)}, "ks must be int32 \\[M=2\\]"),
    ],
)
def test_ragged_bad_input(changes, message):
    with pytest.raises(ValueError, match=message):
        indexer.logits_ragged(**_ragged_args(**changes))


def test_paged_bad_input():
    cache = torch.zeros(2, 4 * 132, dtype=torch.uint8)
    table = torch.tensor([[0, -1]], dtype=torch.int32)
    q, w = torch.zeros(1, 2, 3, 128), torch.zeros(2, 3)
    lens = torch.tensor([[3, 4]], dtype=torch.int32)
    with pytest.raises(ValueError, match="must lie in \\[0, min\\(max_ctx=3"):
        indexer.logits_paged(q, w, cache, "fp8", table, lens, 3)
    with pytest.raises(ValueError, match="unallocated"):
        indexer.logits_paged(q, w, cache, "fp8", table, lens + 2, 8)
    with pytest.raises(ValueError, match="context_lens must be int32 \\[B=1, n=2\\]"):
        indexer.logits_paged(q, w, cache, "fp8", table, lens[0], 8)
    with pytest.raises(ValueError, match="cache must be uint8 \\[num_blocks, block_size \\* 68\\]"):
        indexer.logits_paged(q, w, cache[:, :100], "mxfp4", table, lens, 8)
    with pytest.raises(ValueError, match="block_table must be int32 \\[B=1"):
        indexer.logits_paged(q, w, cache, "fp8", table.float(), lens, 8)
    with pytest.raises(ValueError, match="weights must be float32 \\[2, 3\\]"):
        indexer.logits_paged(q, w[:1], cache, "fp8", table, lens, 8)
    with pytest.raises(ValueError, match="at least next_n=2"):
        indexer.next_n_context_lens(torch.tensor([1, 5], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="next_n must be a positive int"):
        indexer.next_n_context_lens(torch.tensor([1], dtype=torch.int32), 0)


def test_ragged_call_without_keys():
    elements, scales = torch.zeros(0, 64, dtype=torch.uint8), torch.zeros(0, 4, dtype=torch.uint8)
    zeros = torch.zeros(2, dtype=torch.int32)
    out = indexer.logits_ragged(
        torch.ones(2, 3, 128), torch.ones(2, 3), elements, scales, "mxfp4", zeros, zeros
    )
    assert out.shape == (2, 0)
