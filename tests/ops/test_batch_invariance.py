"""Batch invariance: a row's result is bitwise the same whatever else is in the batch.

Each op runs once on a batch and once per row (or request) alone; every row must match bit for
bit (floats compared as integers, so even -0.0 vs +0.0 or a NaN payload would count). A
negative control shows the check catches a real batch dependence.
"""

from __future__ import annotations

import torch

from hwrun.formats.index_keys import INDEX_KEY_FORMATS
from hwrun.ops import attn, indexer, kda, kv_write, sparse_mla, topk


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])
    return t


def mismatched_rows(batched, alone) -> list[int]:
    """Rows whose batched outputs differ in any bit from the same row computed alone.

    ``batched`` is a tuple of tensors indexed by row on dim 0 (or dim 0 of each group of rows);
    ``alone[r]`` the same tuple computed for row ``r`` alone (with a leading dim of 1).
    """
    bad = []
    for r, single in enumerate(alone):
        same = all(
            torch.equal(_bits(b[r : r + 1]), _bits(s)) for b, s in zip(batched, single, strict=True)
        )
        if not same:
            bad.append(r)
    return bad


def _global_shift_softmax(x: torch.Tensor) -> tuple[torch.Tensor]:
    # Mathematically a row-wise softmax, but shifted by the batch maximum: a classic batch
    # dependence (the rounding of exp(x - m) depends on what else is in the batch).
    e = torch.exp(x - x.max())
    return (e / e.sum(-1, keepdim=True),)


def test_negative_control_the_check_catches_batch_dependence():
    x = _randn(8, 33, seed=1) * 4
    batched = _global_shift_softmax(x)
    alone = [_global_shift_softmax(x[r : r + 1]) for r in range(8)]
    assert mismatched_rows(batched, alone)  # the check can fail ...
    rowwise = [(torch.softmax(x[r : r + 1], -1),) for r in range(8)]
    assert not mismatched_rows((torch.softmax(x, -1),), rowwise)  # ... and passes when it should


def test_indexer_logits_ragged_and_topk():
    rows, heads = 9, 7
    q, w = _randn(rows, heads, 128, seed=2).bfloat16(), _randn(rows, heads, seed=3)
    elements, scales = INDEX_KEY_FORMATS["fp8"].encode(_randn(45, 128, seed=4))
    ks = torch.tensor([0, 3, 0, 10, 44, 5, 0, 20, 7], dtype=torch.int32)
    ke = torch.tensor([45, 30, 1, 10, 45, 39, 17, 45, 8], dtype=torch.int32)
    logits = indexer.logits_ragged(q, w, elements, scales, "fp8", ks, ke)
    alone = [
        (
            indexer.logits_ragged(
                q[r : r + 1], w[r : r + 1], elements, scales, "fp8", ks[r : r + 1], ke[r : r + 1]
            ),
        )
        for r in range(rows)
    ]
    assert not mismatched_rows((logits,), alone)
    best = topk.topk(logits, ks, ke, 16)
    alone = [(topk.topk(logits[r : r + 1], ks[r : r + 1], ke[r : r + 1], 16),) for r in range(rows)]
    assert not mismatched_rows((best,), alone)


def test_indexer_logits_paged_per_request():
    batch, next_n, heads, block_size = 3, 2, 5, 16
    cache = torch.zeros(10, block_size * 68, dtype=torch.uint8)
    kv_write.write_index_keys(
        cache, _randn(160, 128, seed=5), torch.arange(160, dtype=torch.int32), "mxfp4"
    )
    table = torch.tensor([[9, 2, 4, 1], [0, 3, -1, -1], [5, 6, 7, 8]], dtype=torch.int32)
    lens = indexer.next_n_context_lens(torch.tensor([50, 19, 64], dtype=torch.int32), next_n)
    q, w = (
        _randn(batch, next_n, heads, 128, seed=6).bfloat16(),
        _randn(batch * next_n, heads, seed=7),
    )
    out = indexer.logits_paged(q, w, cache, "mxfp4", table, lens, 64).view(batch, next_n, 64)
    alone = [
        (
            indexer.logits_paged(
                q[b : b + 1],
                w[b * next_n : (b + 1) * next_n],
                cache,
                "mxfp4",
                table[b : b + 1],
                lens[b : b + 1],
                64,
            ).view(1, next_n, 64),
        )
        for b in range(batch)
    ]
    assert not mismatched_rows((out,), alone)


def test_to_slots():
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    idx = torch.tensor([[0, 5, -1], [4, 7, 1], [0, -1, 6]], dtype=torch.int32)
    owner = torch.tensor([0, 0, 1], dtype=torch.int32)
    out = topk.to_slots(idx, table, 4, owner)
    alone = [(topk.to_slots(idx[r : r + 1], table, 4, owner[r : r + 1]),) for r in range(3)]
    assert not mismatched_rows((out,), alone)


def test_sparse_mla_decode_per_request_and_prefill_per_token():
    cache = torch.zeros(6, 16, 656, dtype=torch.uint8)
    latent = _randn(96, 576, seed=8)
    kv_write.write_latent(
        cache, latent[:, :512], latent[:, 512:], torch.arange(96, dtype=torch.int32), "fp8_ds_mla"
    )
    gen = torch.Generator().manual_seed(9)
    slots = torch.randint(-1, 96, (4, 2, 40), generator=gen).int()
    slots[2] = -1  # a request with nothing to attend to
    q = _randn(4, 2, 6, 576, seed=10).bfloat16()
    sink = _randn(6, seed=11)
    length = torch.randint(0, 41, (4, 2), generator=gen).int()
    out = sparse_mla.decode(q, cache, "fp8_ds_mla", slots, 0.04, length, sink)
    alone = [
        sparse_mla.decode(
            q[b : b + 1], cache, "fp8_ds_mla", slots[b : b + 1], 0.04, length[b : b + 1], sink
        )
        for b in range(4)
    ]
    assert not mismatched_rows(out, alone)

    kv = latent.bfloat16()
    idx = slots.view(8, 40)
    out = sparse_mla.prefill(q.view(8, 6, 576), kv, idx, 0.04, length.view(8), sink)
    alone = [
        sparse_mla.prefill(
            q.view(8, 6, 576)[t : t + 1], kv, idx[t : t + 1], 0.04, length.view(8)[t : t + 1], sink
        )
        for t in range(8)
    ]
    assert not mismatched_rows(out, alone)


def test_lse_combine_per_row():
    outs, lses = _randn(3, 7, 4, 64, seed=12), _randn(3, 7, 4, seed=13) * 5
    lses[1, 2] = float("-inf")
    out, lse = attn.lse_combine(outs, lses)
    alone = [attn.lse_combine(outs[:, r : r + 1], lses[:, r : r + 1]) for r in range(7)]
    assert not mismatched_rows((out, lse), alone)


def test_kda_step_and_chunk_per_sequence():
    b, t, h, hv, kd, vd = 3, 11, 2, 4, 16, 8
    q, k = (
        _randn(b, t, h, kd, seed=14),
        torch.nn.functional.normalize(_randn(b, t, h, kd, seed=15), dim=-1),
    )
    v, g = _randn(b, t, hv, vd, seed=16), -torch.rand(b, t, hv, kd) * 0.2
    beta, state = torch.rand(b, t, hv), _randn(b, hv, kd, vd, seed=17)
    for fn in (kda.step, kda.chunk):
        out = fn(q, k, v, g, beta, state)
        alone = [fn(*(x[i : i + 1] for x in (q, k, v, g, beta, state))) for i in range(b)]
        assert not mismatched_rows(out, alone), fn.__name__


def test_cache_writes_per_token():
    latent = _randn(5, 576, seed=18) * 3
    slots = torch.tensor([3, 0, 7, 12, 9], dtype=torch.int32)
    for fmt in ("fp8_ds_mla", "nvfp4_ds_mla"):
        row_bytes = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}[fmt]
        together = torch.zeros(2, 8, row_bytes, dtype=torch.uint8)
        kv_write.write_latent(together, latent[:, :512], latent[:, 512:], slots, fmt)
        for i, slot in enumerate(slots.tolist()):
            alone = torch.zeros(2, 8, row_bytes, dtype=torch.uint8)
            kv_write.write_latent(
                alone, latent[i : i + 1, :512], latent[i : i + 1, 512:], slots[i : i + 1], fmt
            )
            assert torch.equal(alone.view(16, -1)[slot], together.view(16, -1)[slot])


def test_strided_inputs_give_the_same_bits_as_contiguous_ones():
    # Vendor glue often hands over views (a head slice, a transposed buffer); the result of a
    # row must not depend on the memory layout of its inputs either.
    wide_q = _randn(4, 9, 600, seed=19)
    q = wide_q[:, 1:7, :576]  # [4, 6, 576], non-contiguous
    kv, idx = (
        _randn(50, 576, seed=20),
        torch.randint(-1, 50, (4, 12), generator=torch.Generator().manual_seed(3)).int(),
    )
    out = sparse_mla.prefill(q, kv, idx, 0.04)
    ref = sparse_mla.prefill(q.contiguous(), kv, idx, 0.04)
    assert not mismatched_rows(out, [tuple(x[r : r + 1] for x in ref) for r in range(4)])
    qi = _randn(5, 128, 3, seed=21).transpose(1, 2)  # [5, 3, 128], non-contiguous
    w = _randn(3, 5, seed=22).T
    elements, scales = INDEX_KEY_FORMATS["bf16"].encode(_randn(20, 128, seed=23))
    ks, ke = torch.zeros(5, dtype=torch.int32), torch.full((5,), 20, dtype=torch.int32)
    out = indexer.logits_ragged(qi, w, elements, scales, "bf16", ks, ke)
    ref = indexer.logits_ragged(qi.contiguous(), w.contiguous(), elements, scales, "bf16", ks, ke)
    assert torch.equal(_bits(out), _bits(ref))
    b, t, h, kd, vd = 2, 7, 2, 8, 4
    wide = _randn(b, t, h, kd + 3, seed=24)
    q, k = wide[..., :kd], torch.nn.functional.normalize(_randn(b, t, h, kd, seed=25), dim=-1)
    v, g, beta = _randn(b, t, h, vd, seed=26), -torch.rand(b, t, h, kd) * 0.2, torch.rand(b, t, h)
    state = _randn(b, h, vd, kd, seed=27).transpose(-1, -2)  # [B, HV, K, V] value-major in memory
    for fn in (kda.step, kda.chunk):
        out = fn(q, k, v, g, beta, state)
        ref = fn(q.contiguous(), k, v, g, beta, state.contiguous())
        assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(out, ref, strict=True))
