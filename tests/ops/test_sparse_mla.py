"""sparse_mla: dense equivalence, padding, topk_length, sink, empty rows, latent formats."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.formats.latent import LATENT_FORMATS
from hwrun.ops import kv_write, sparse_mla

INF = float("inf")


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _causal_indices(seq: int, k: int, seed: int = 0) -> torch.Tensor:
    """Row i: all of 0..i in a shuffled order with -1 scattered between them, width k."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((seq, k), -1, dtype=torch.int32)
    for i in range(seq):
        places = torch.randperm(k, generator=gen)[: i + 1].sort().values
        out[i, places] = torch.randperm(i + 1, generator=gen).int()
    return out


def test_topk_covering_the_context_equals_dense_absorbed_mla():
    # 45 tokens (not a power of two), 20 heads (not a multiple of 16), top-k 64 > context.
    seq, heads, scale = 45, 20, 576**-0.5
    q, kv = _randn(seq, heads, 576, seed=1), _randn(seq, 576, seed=2)
    out, lse = sparse_mla.prefill(q, kv, _causal_indices(seq, 64), scale)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        kv.expand(heads, seq, 576),
        kv[:, :512].expand(heads, seq, 512),
        attn_mask=causal,
        scale=scale,
    ).transpose(0, 1)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)
    scores = torch.einsum("thd,sd->ths", q.double(), kv.double()) * scale
    ref_lse = scores.masked_fill(~causal[:, None, :], -INF).logsumexp(-1)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-5)


def test_minus_one_padding_anywhere_never_changes_the_result_bitwise():
    heads, scale = 5, 0.07
    q, kv = _randn(1, heads, 576, seed=3), _randn(300, 576, seed=4)
    chosen = torch.tensor([17, 3, 250, 99, 0, 42, 180], dtype=torch.int32)
    layouts = [chosen[None]]
    for width, seed in ((16, 0), (64, 1), (333, 2)):
        row = torch.full((1, width), -1, dtype=torch.int32)
        places = torch.randperm(width, generator=torch.Generator().manual_seed(seed))[:7]
        row[0, places.sort().values] = chosen  # same valid entries, same order
        layouts.append(row)
    results = [sparse_mla.prefill(q, kv, idx, scale) for idx in layouts]
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    # topk_length is the same as -1 past it.
    padded = torch.cat([chosen, torch.tensor([5, 6, 7], dtype=torch.int32)])[None]
    out, lse = sparse_mla.prefill(q, kv, padded, scale, topk_length=torch.tensor([7]))
    assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


def test_attention_sink_is_one_extra_logit_in_the_denominator_only():
    heads, scale = 6, 0.05
    q, kv = _randn(3, heads, 576, seed=5), _randn(20, 576, seed=6)
    idx = torch.tensor([[0, 4, 9, -1], [1, 2, 3, 19], [7, -1, -1, -1]], dtype=torch.int32)
    sink = torch.tensor([-1.0, 0.0, 2.0, 5.0, -INF, INF])
    plain_out, plain_lse = sparse_mla.prefill(q, kv, idx, scale)
    out, lse = sparse_mla.prefill(q, kv, idx, scale, attn_sink=sink)
    assert torch.equal(lse, plain_lse)  # the sink never enters the LSE (FlashMLA)
    for t in range(3):
        keys = kv[idx[t][idx[t] >= 0].long()].double()
        s = (q[t].double() @ keys.T) * scale  # [H, n]
        denom = s.exp().sum(-1) + sink.double().exp()
        ref = (s.exp() @ keys[:, :512]) / denom[:, None]
        torch.testing.assert_close(out[t].double(), ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[:, 4], plain_out[:, 4])  # -inf sink: no effect
    assert torch.equal(out[:, 5], torch.zeros_like(out[:, 5]))  # +inf sink: all weight on it


def test_rows_without_a_valid_entry_give_zero_and_minus_inf():
    q, kv = _randn(3, 4, 576, seed=7), _randn(10, 576, seed=8)
    idx = torch.tensor([[-1, -1], [2, 3], [4, 5]], dtype=torch.int32)
    length = torch.tensor([2, 2, 0], dtype=torch.int32)
    sink = torch.ones(4)
    out, lse = sparse_mla.prefill(q.bfloat16(), kv, idx, 0.1, topk_length=length, attn_sink=sink)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    for t in (0, 2):
        assert torch.equal(out[t], torch.zeros_like(out[t])) and bool((lse[t] == -INF).all())
    assert bool(lse[1].isfinite().all())


@pytest.mark.parametrize("fmt", sorted(LATENT_FORMATS))
def test_decode_reads_every_latent_format_from_a_strided_paged_cache(fmt):
    row_bytes, block_size, num_blocks = LATENT_FORMATS[fmt].row_bytes, 16, 5
    latent_scale = 0.5 if fmt == "fp8_e4m3" else None
    # The layer's rows inside a wider packed block (other layers' bytes live in the gap).
    packed = torch.zeros(num_blocks, block_size * row_bytes + 96, dtype=torch.uint8)
    cache = packed[:, : block_size * row_bytes].unflatten(1, (block_size, row_bytes))
    tokens = 70
    latent = _randn(tokens, 576, seed=9)
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(1))
    slots = slots[:tokens].int()
    kv_write.write_latent(cache, latent[:, :512], latent[:, 512:], slots, fmt, latent_scale)
    # next_n = 3 rows for each of 2 requests; -1 and topk_length both mask entries.
    gen = torch.Generator().manual_seed(2)
    picks = torch.randint(0, tokens, (2, 3, 24), generator=gen)
    chosen = torch.where(torch.rand(2, 3, 24, generator=gen) < 0.2, -1, slots[picks])
    length = torch.tensor([[24, 10, 0], [24, 24, 3]], dtype=torch.int32)
    q = _randn(2, 3, 7, 576, seed=10).bfloat16()
    out, lse = sparse_mla.decode(q, cache, fmt, chosen, 0.04, length, None, latent_scale)
    assert out.shape == (2, 3, 7, 512) and lse.shape == (2, 3, 7) and out.dtype == torch.bfloat16
    # Oracle: prefill over the decoded rows, indexed by token instead of slot.
    decoded = LATENT_FORMATS[fmt].decode(
        packed[:, : block_size * row_bytes].reshape(-1, row_bytes), latent_scale
    )
    ref_out, ref_lse = sparse_mla.prefill(
        q.reshape(6, 7, 576), decoded, chosen.reshape(6, 24), 0.04, length.reshape(6)
    )
    assert torch.equal(out.reshape(6, 7, 512), ref_out) and torch.equal(lse.reshape(6, 7), ref_lse)
    assert bool((lse[0, 2] == -INF).all())
    if fmt == "bf16":  # lossless for bf16 latents: the decoded rows are the written ones
        bf = latent.bfloat16().float()
        assert torch.equal(decoded[slots.long()], bf)


def test_lse_is_a_natural_log():
    q = torch.zeros(1, 1, 576)
    kv = torch.zeros(4, 576)
    _, lse = sparse_mla.prefill(q, kv, torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), 1.0)
    assert math.isclose(float(lse), math.log(4.0), rel_tol=1e-6)  # base 2 would give 2.0


def _prefill_args(**changes):
    args = {
        "q": torch.zeros(2, 3, 576),
        "kv": torch.zeros(8, 576),
        "indices": torch.zeros(2, 4, dtype=torch.int32),
        "softmax_scale": 0.1,
    }
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"q": torch.zeros(2, 3, 512)}, "last dim must be 576"),
        ({"q": torch.zeros(2, 3, 576, dtype=torch.int8)}, "q must be bfloat16"),
        ({"kv": torch.zeros(8, 512)}, "kv must be a float \\[S, 576\\]"),
        ({"indices": torch.zeros(3, 4, dtype=torch.int32)}, "indices must be int32 \\[T=2, k\\]"),
        ({"indices": torch.zeros(2, 4)}, "indices must be int32"),
        ({"indices": torch.zeros(2, 0, dtype=torch.int32)}, "k >= 1"),
        ({"indices": torch.tensor([[0, 8, 1, 2]] * 2, dtype=torch.int32)}, "must be < 8"),
        (
            {"indices": torch.tensor([[0, -2, 1, 2]] * 2, dtype=torch.int32)},
            "never another negative",
        ),
        ({"topk_length": torch.tensor([5, 1], dtype=torch.int32)}, "topk_length must lie in"),
        (
            {"topk_length": torch.tensor([1], dtype=torch.int32)},
            "topk_length must be int32 \\[T=2\\]",
        ),
        ({"attn_sink": torch.zeros(4)}, "attn_sink must be \\[H=3\\]"),
        ({"softmax_scale": 0.0}, "softmax_scale must be a positive float"),
    ],
)
def test_prefill_bad_input(changes, message):
    with pytest.raises(ValueError, match=message):
        sparse_mla.prefill(**_prefill_args(**changes))


def test_decode_bad_input():
    cache = torch.zeros(2, 4, 656, dtype=torch.uint8)
    q = torch.zeros(1, 1, 2, 576)
    slots = torch.zeros(1, 1, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="must be < 8"):
        sparse_mla.decode(q, cache, "fp8_ds_mla", slots + 8, 0.1)
    with pytest.raises(ValueError, match="cache must be uint8 \\[num_blocks, block_size, 1152\\]"):
        sparse_mla.decode(q, cache, "bf16", slots, 0.1)
    with pytest.raises(ValueError, match="unknown latent format"):
        sparse_mla.decode(q, cache, "fp16", slots, 0.1)
    with pytest.raises(ValueError, match="slots must be int32 \\[B=1, s=1, k\\]"):
        sparse_mla.decode(q, cache, "fp8_ds_mla", slots[0], 0.1)
    with pytest.raises(ValueError, match="q must be \\[B, s, H, 576\\]"):
        sparse_mla.decode(q[0], cache, "fp8_ds_mla", slots, 0.1)
    with pytest.raises(ValueError, match="topk_length must be int32 \\[B=1, s=1\\]"):
        sparse_mla.decode(q, cache, "fp8_ds_mla", slots, 0.1, torch.tensor([1]))


def test_decode_of_a_batch_with_no_valid_slot_at_all():
    cache = torch.zeros(2, 4, 656, dtype=torch.uint8)
    q = _randn(2, 1, 3, 576, seed=11)
    out, lse = sparse_mla.decode(q, cache, "fp8_ds_mla", torch.full((2, 1, 5), -1), 0.1)
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == -INF).all())


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 4),
    heads=st.integers(1, 9),
    width=st.integers(1, 12),
    workspace=st.integers(1, 30),
    use_length=st.booleans(),
    use_sink=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_prefill_matches_the_float64_formula(
    tokens, heads, width, workspace, use_length, use_sink, seed
):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, 576, generator=gen)
    kv = torch.randn(workspace, 576, generator=gen)
    idx = torch.randint(-1, workspace, (tokens, width), generator=gen).int()
    length = torch.randint(0, width + 1, (tokens,), generator=gen).int() if use_length else None
    sink = torch.randn(heads, generator=gen) if use_sink else None
    out, lse = sparse_mla.prefill(q, kv, idx, 0.05, length, sink)
    for t in range(tokens):
        valid = idx[t] >= 0
        if length is not None:
            valid &= torch.arange(width) < length[t]
        keys = kv[idx[t][valid].long()].double()
        if keys.shape[0] == 0:
            assert torch.equal(out[t], torch.zeros_like(out[t])) and bool((lse[t] == -INF).all())
            continue
        s = q[t].double() @ keys.T * 0.05
        ref_lse = s.logsumexp(-1)
        denom = ref_lse.exp() + (sink.double().exp() if sink is not None else 0.0)
        ref = s.exp() @ keys[:, :512] / denom[:, None]
        torch.testing.assert_close(lse[t].double(), ref_lse, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(out[t].double(), ref, rtol=1e-5, atol=1e-5)
