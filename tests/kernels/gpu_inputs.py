"""Inputs and comparisons shared by the GPU tests of the Triton kernels (tests/kernels) and of
the vendor adapters (plugins/nvidia/tests): paged index-key caches, latent caches with -1
padding, empty rows and sinks, the metrics both judge by, and the mark of tests that need
Hopper's warpgroup MMA (the Gluon kernels')."""

from __future__ import annotations

import pytest
import torch

from hwrun import knobs
from hwrun.formats.index_keys import get_index_key_format
from hwrun.formats.latent import get_latent_format

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available()
    or knobs.triton_interpret()
    or torch.cuda.get_device_capability()[0] != 9,
    reason="needs an sm_90 GPU (the warpgroup MMA)",
)


def relative_error(got, want):
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), "-inf positions differ"
    return ((got[finite] - want[finite]).norm() / want[finite].norm()).item()


def sets_equal(got, want):
    g, _ = torch.sort(got.long(), dim=1)
    w, _ = torch.sort(want.long(), dim=1)
    return torch.equal(g, w)


def indexer_like_logits(rows, length, heads=64):
    """Decode-like top-k input: the reference indexer's scores (sum_h w_h relu(q_h . k)) of
    random fp8 queries against random fp8 keys, with signed head weights as the models'
    projection gives them."""
    from hwrun.ops.indexer import logits_ragged

    elements, scales = get_index_key_format("fp8").encode(torch.randn(length, 128, device="cuda"))
    q = torch.randn(rows, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, device="cuda") * heads**-0.5
    ks = torch.zeros(rows, dtype=torch.int32, device="cuda")
    ke = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    return logits_ragged(q, w, elements, scales, "fp8", ks, ke)


def paged_inputs(fmt, batch, ctx, heads, next_n, q_dtype):
    key_format = get_index_key_format(fmt)
    blocks = batch * (ctx // 64)
    elements, scales = key_format.encode(torch.randn(blocks * 64, 128, device="cuda"))
    cache = torch.cat((elements.reshape(blocks, -1), scales.reshape(blocks, -1)), 1)
    table = torch.randperm(blocks, device="cuda").to(torch.int32).reshape(batch, -1)
    q = torch.randn(batch, next_n, heads, 128, device="cuda").to(q_dtype)
    w = torch.rand(batch * next_n, heads, device="cuda")
    last = torch.randint(ctx // 2, ctx + 1, (batch,), device="cuda", dtype=torch.int32)
    last[0] = 0 if batch > 1 else last[0]  # an empty request
    lens = (last[:, None] - (next_n - 1) + torch.arange(next_n, device="cuda")).clamp(min=0)
    return q, w, cache, table, lens.to(torch.int32)


def mla_inputs(fmt, batch, s, heads, k):
    tokens = 64 * 512
    latent = get_latent_format(fmt)
    rows = latent.encode(
        torch.randn(tokens, 512, device="cuda"), torch.randn(tokens, 64, device="cuda")
    )
    cache = rows.reshape(tokens // 64, 64, latent.row_bytes)
    q = torch.randn(batch, s, heads, 576, device="cuda", dtype=torch.bfloat16)
    slots = torch.randint(0, tokens, (batch, s, k), device="cuda", dtype=torch.int32)
    slots[0, 0, k // 2 :] = -1
    if batch > 1:
        slots[1, 0, :] = -1  # an empty row
    lengths = torch.full((batch, s), k, device="cuda", dtype=torch.int32)
    lengths[-1, -1] = k // 3
    sink = torch.randn(heads, device="cuda")
    return q, cache, slots, lengths, sink


def check_mla(got, want):
    (out, lse), (ref_out, ref_lse) = got, want
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max() < 2e-2
    err = (out.float() - ref_out.float()).norm() / ref_out.float().norm()
    assert err < 1e-2, err
