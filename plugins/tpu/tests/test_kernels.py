"""Each Pallas kernel against the core's reference at small shapes, with the contract's edge
cases: contexts shorter than top-k, -1 padding, ties, empty rows, NaN and zero rows in the
cache writes. They run in Pallas's TPU interpret mode (HWRUN_PALLAS_INTERPRET=tpu), which
emulates the TPU's memories, DMAs and scalar prefetch and raises on an out-of-bounds read, so
a DMA to a wrong slot or a block-table index past the cache fails here."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.index_keys import get_index_key_format
from hwrun.formats.latent import get_latent_format
from hwrun.ops import attn, indexer, kv_write, sparse_mla
from hwrun.ops import topk as topk_ref
from hwrun_tpu import attn as tpu_attn
from hwrun_tpu import indexer as tpu_indexer
from hwrun_tpu import kv_write as tpu_kv_write
from hwrun_tpu import sparse_mla as tpu_sparse_mla
from hwrun_tpu import topk as tpu_topk


@pytest.fixture(autouse=True)
def _tpu_interpret_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "tpu")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _same_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    """-inf exactly where the reference has it, the rest to fp32 rounding."""
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = ~torch.isinf(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
def test_write_latent_bytes_equal_the_reference(fmt: str) -> None:
    g = _gen(1)
    nope = (torch.randn(6, 512, generator=g) * 3).to(torch.bfloat16)
    rope = torch.randn(6, 64, generator=g).to(torch.bfloat16)
    nope[1] = 0  # an all-zero tile: the FLT_MIN scale
    nope[2, :7] = float("nan")
    nope[3, 130] = float("inf")
    rope[4, 5] = float("nan")
    slots = torch.tensor([9, -1, 0, 15, 4, -1], dtype=torch.int32)  # -1: skipped
    row_bytes = get_latent_format(fmt).row_bytes
    cache = torch.randint(0, 256, (2, 8, row_bytes), generator=g).to(torch.uint8)
    want, got = cache.clone(), cache.clone()
    kv_write.write_latent(want, nope, rope, slots, fmt)
    tpu_kv_write.write_latent(got, nope, rope, slots, fmt)
    assert torch.equal(got, want)  # written rows byte for byte, every other row untouched


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_write_index_keys_bytes_equal_the_reference(fmt: str) -> None:
    g = _gen(2)
    keys = torch.randn(7, 128, generator=g).to(torch.bfloat16)
    keys[0] = 0  # the amax floor
    keys[1, 3] = float("nan")
    keys[2] *= 1e-6
    slots = torch.tensor([0, 15, -1, 16, 47, 3, 33], dtype=torch.int32)
    bpt = get_index_key_format(fmt).bytes_per_token
    cache = torch.randint(0, 256, (3, 16 * bpt), generator=g).to(torch.uint8)
    want, got = cache.clone(), cache.clone()
    kv_write.write_index_keys(want, keys, slots, fmt)
    tpu_kv_write.write_index_keys(got, keys, slots, fmt)
    assert torch.equal(got, want)


def test_cache_writes_refuse_a_repeated_slot() -> None:
    cache = torch.zeros(1, 4, 656, dtype=torch.uint8)
    rows = torch.zeros(2, 512), torch.zeros(2, 64)
    with pytest.raises(ValueError, match="at most once"):
        tpu_kv_write.write_latent(
            cache, *rows, torch.tensor([1, 1], dtype=torch.int32), "fp8_ds_mla"
        )


def _paged_keys(g: torch.Generator, fmt: str, num_blocks: int, block_size: int) -> torch.Tensor:
    key_format = get_index_key_format(fmt)
    cache = torch.zeros(num_blocks, block_size * key_format.bytes_per_token, dtype=torch.uint8)
    keys = torch.randn(num_blocks * block_size, 128, generator=g).to(torch.bfloat16)
    slots = torch.arange(num_blocks * block_size, dtype=torch.int32)
    kv_write.write_index_keys(cache, keys, slots, fmt)
    return cache


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_logits_paged_short_and_empty_contexts(fmt: str) -> None:
    g = _gen(3)
    block_size, heads = 16, 4  # 4 index heads: many exact-zero (ReLU) scores
    cache = _paged_keys(g, fmt, 6, block_size)
    # Request 0 ends inside its first block, 1 has no context, 2 spans two blocks (the second
    # partial); table entries past a context are -1.
    table = torch.tensor([[4, -1, -1], [-1, -1, -1], [1, 5, -1]], dtype=torch.int32)
    context_lens = torch.tensor([[5], [0], [20]], dtype=torch.int32)
    q = torch.randn(3, 1, heads, 128, generator=g).to(torch.bfloat16)
    weights = torch.randn(3, heads, generator=g)
    args = (q, weights, cache, fmt, table, context_lens, 48)
    got, want = tpu_indexer.logits_paged(*args), indexer.logits_paged(*args)
    _same_logits(got, want)
    assert torch.isinf(got[1]).all()  # the empty context: every score -inf


def test_logits_paged_next_n_with_fp8_query_codes() -> None:
    g = _gen(4)
    cache = _paged_keys(g, "fp8", 4, 16)
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    context_lens = indexer.next_n_context_lens(torch.tensor([18, 7], dtype=torch.int32), 2)
    q = torch.randn(2, 2, 8, 128, generator=g).to(torch.float8_e4m3fn)
    weights = torch.rand(4, 8, generator=g)
    args = (q, weights, cache, "fp8", table, context_lens, 40)
    _same_logits(tpu_indexer.logits_paged(*args), indexer.logits_paged(*args))


def test_logits_ragged_empty_rows_and_partial_tiles() -> None:
    g = _gen(5)
    num_keys = 200  # two 128-key tiles, the second partial
    elements, scales = get_index_key_format("fp8").encode(torch.randn(num_keys, 128, generator=g))
    ks = torch.tensor([0, 10, 150, 60], dtype=torch.int32)
    ke = torch.tensor([0, 140, 200, 61], dtype=torch.int32)  # row 0 empty, row 3 one key
    q = torch.randn(4, 4, 128, generator=g).to(torch.bfloat16)
    weights = torch.randn(4, 4, generator=g)
    args = (q, weights, elements, scales, "fp8", ks, ke)
    got, want = tpu_indexer.logits_ragged(*args), indexer.logits_ragged(*args)
    _same_logits(got, want)
    assert torch.isinf(got[0]).all()


def test_topk_short_rows_ties_and_empty_rows() -> None:
    g = _gen(6)
    logits = torch.randn(6, 40, generator=g)
    logits[1] = torch.relu(logits[1])  # about half the row ties at exactly 0
    logits[2, :20] = 0.0
    logits[2, 5] = -0.0  # equal to +0.0
    logits[3, 3:9] = float("nan")  # NaN counts as -inf: chosen last
    logits[3, 10] = float("-inf")
    starts = torch.tensor([0, 0, 2, 0, 7, 30], dtype=torch.int32)
    ends = torch.tensor([40, 40, 30, 12, 7, 35], dtype=torch.int32)  # row 4 empty, 5 short
    k = 8
    got, want = tpu_topk.topk(logits, starts, ends, k), topk_ref.topk(logits, starts, ends, k)
    # The reference lists best first; the kernel in index order: the same set, -1 after it.
    assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)
    assert (got[4] == -1).all()
    assert torch.equal(got[5], torch.tensor([0, 1, 2, 3, 4, -1, -1, -1], dtype=torch.int32))


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
def test_sparse_mla_decode_padding_empty_rows_length_and_sink(fmt: str) -> None:
    g = _gen(7)
    latent = get_latent_format(fmt)
    tokens, heads, k = 32, 6, 8
    rows = latent.encode(
        torch.randn(tokens, 512, generator=g), torch.randn(tokens, 64, generator=g)
    )
    cache = rows.view(2, 16, latent.row_bytes)
    slots = torch.randint(0, tokens, (2, 2, k), generator=g).to(torch.int32)
    slots[0, 0] = -1  # an empty row: out 0, lse -inf
    slots[1, 0, ::3] = -1  # padding anywhere
    topk_length = torch.tensor([[k, 5], [k, 1]], dtype=torch.int32)
    q = (torch.randn(2, 2, heads, 576, generator=g) * 0.5).to(torch.bfloat16)
    args = (q, cache, fmt, slots, 576**-0.5, topk_length, torch.randn(heads, generator=g))
    out, lse = tpu_sparse_mla.decode(*args)
    want_out, want_lse = sparse_mla.decode(*args)
    torch.testing.assert_close(out.float(), want_out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, want_lse, rtol=1e-4, atol=1e-4)
    assert (out[0, 0] == 0).all() and (lse[0, 0] == float("-inf")).all()


def test_sparse_mla_prefill_fp32_workspace() -> None:
    g = _gen(8)
    kv = torch.randn(40, 576, generator=g)
    indices = torch.randint(0, 40, (3, 16), generator=g).to(torch.int32)
    indices[1] = -1
    q = (torch.randn(3, 4, 576, generator=g) * 0.5).to(torch.bfloat16)
    out, lse = tpu_sparse_mla.prefill(q, kv, indices, 576**-0.5)
    want_out, want_lse = sparse_mla.prefill(q, kv, indices, 576**-0.5)
    torch.testing.assert_close(out.float(), want_out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, want_lse, rtol=1e-4, atol=1e-4)


def test_lse_combine_empty_parts_add_nothing() -> None:
    g = _gen(9)
    outs = torch.randn(3, 5, 4, 16, generator=g)
    lses = torch.randn(3, 5, 4, generator=g)
    lses[0, 1] = float("-inf")
    outs[0, 1] = float("nan")  # an empty part's output is ignored, even NaN
    lses[:, 2, 3] = float("-inf")  # every part empty: out 0, lse -inf
    out, lse = tpu_attn.lse_combine(outs, lses)
    want_out, want_lse = attn.lse_combine(outs, lses)
    torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    assert (out[2, 3] == 0).all() and lse[2, 3] == float("-inf")


def test_logits_paged_refuses_a_context_over_an_unallocated_page() -> None:
    cache = torch.zeros(2, 16 * 132, dtype=torch.uint8)
    table = torch.tensor([[1, -1]], dtype=torch.int32)
    q, weights = torch.zeros(1, 1, 4, 128), torch.zeros(1, 4)
    lens = torch.tensor([[17]], dtype=torch.int32)  # token 16 lives in the unallocated block
    with pytest.raises(ValueError, match="unallocated"):
        tpu_indexer.logits_paged(q, weights, cache, "fp8", table, lens, 32)
