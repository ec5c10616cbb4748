"""The AITER sparse MLA decode adapter (mla_decode_fwd) against a fake AITER and hwrun's
reference: one-token pages from hwrun's (packed) paged cache, heads padded to 16, natural-log
LSE, empty rows; negative controls show each conversion is needed."""

from __future__ import annotations

import pytest
import torch

from hwrun.ops import kv_write as ref_kv_write
from hwrun.ops import sparse_mla as ref_sparse_mla
from hwrun.registry import OpSpec
from hwrun_amd import aiter_mla, device_checks

ROW = aiter_mla.LATENT.row_bytes  # 1152


def _problem(g, heads, packed=False, blocks=5, block=16, batch=2, next_n=2, k=24):
    stride_rows = block + (3 if packed else 0)  # a packed layout: other pages between blocks
    storage = torch.zeros(blocks, stride_rows * ROW, dtype=torch.uint8)
    cache = storage[:, : block * ROW].view(blocks, block, ROW)
    tokens = blocks * block
    latent = torch.randn(tokens, 576, generator=g).to(torch.bfloat16)
    all_slots = torch.arange(tokens, dtype=torch.int32)
    ref_kv_write.write_latent(cache, latent[:, :512], latent[:, 512:], all_slots, "bf16")
    slots = torch.randint(0, tokens, (batch, next_n, k), generator=g, dtype=torch.int32)
    slots[0, 1, ::3] = -1  # invalid entries
    slots[1, 0] = -1  # a row with nothing to attend to
    topk_length = torch.tensor([[k, 10], [k, 17]], dtype=torch.int32)
    q = torch.randn(batch, next_n, heads, 576, generator=g).to(torch.bfloat16)
    return (q, cache, "bf16", slots, 576**-0.5, topk_length)


def _close(got, want) -> bool:
    (out, lse), (ref_out, ref_lse) = got, want
    if out.shape != ref_out.shape or out.dtype != ref_out.dtype:
        return False
    if not torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) or torch.isnan(out).any():
        return False
    finite = torch.isfinite(ref_lse)
    return torch.allclose(out.float(), ref_out.float(), rtol=2e-2, atol=1e-2) and torch.allclose(
        lse[finite], ref_lse[finite], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(("heads", "packed"), [(8, False), (16, True), (20, False)])
def test_decode_matches_the_reference(fake_aiter, heads, packed):
    fake = fake_aiter("gfx950")
    args = _problem(torch.Generator().manual_seed(5), heads, packed)
    assert _close(aiter_mla.decode(*args), ref_sparse_mla.decode(*args))
    assert fake.calls == ["mla_decode_fwd"]


def test_aiter_refuses_heads_that_are_not_a_multiple_of_16(fake_aiter, monkeypatch):
    fake_aiter("gfx950")
    monkeypatch.setattr(aiter_mla, "padded_heads", lambda heads: heads)  # no padding
    with pytest.raises(AssertionError, match="multiples of 16"):
        aiter_mla.decode(*_problem(torch.Generator().manual_seed(5), heads=8))


def test_negative_control_empty_rows_left_to_the_kernel(fake_aiter, monkeypatch):
    fake_aiter("gfx950")
    monkeypatch.setattr(aiter_mla, "empty_rows_to_contract", lambda out, lse, valid: (out, lse))
    args = _problem(torch.Generator().manual_seed(5), heads=16)
    assert not _close(aiter_mla.decode(*args), ref_sparse_mla.decode(*args))


def test_negative_control_slots_as_pages_of_a_contiguous_cache(fake_aiter, monkeypatch):
    # Slot x read as page x ignores the packed layout's gap between blocks.
    fake_aiter("gfx950")
    original = aiter_mla.page_lists
    monkeypatch.setattr(
        aiter_mla, "page_lists", lambda s, t, bs, rows_per_block: original(s, t, bs, bs)
    )
    args = _problem(torch.Generator().manual_seed(5), heads=16, packed=True)
    assert not _close(aiter_mla.decode(*args), ref_sparse_mla.decode(*args))


def test_refuses_a_sink_and_other_latent_formats(fake_aiter, monkeypatch):
    fake_aiter("gfx950")
    q, cache, fmt, slots, scale, lengths = _problem(torch.Generator().manual_seed(5), heads=16)
    with pytest.raises(ValueError, match="attention sink"):
        aiter_mla.decode(q, cache, fmt, slots, scale, lengths, torch.zeros(16))
    monkeypatch.setattr(device_checks, "_rocm_available", lambda: True)
    spec = OpSpec(
        "sparse_mla.decode", "bfloat16", ("fp8_ds_mla",), device_type="cuda", arch="gfx942"
    )
    assert any("656-byte" in r for r in aiter_mla._validate(spec))
    ok = OpSpec(
        "sparse_mla.decode", "bfloat16", ("bf16",), 8, 576, device_type="cuda", arch="gfx942"
    )
    assert aiter_mla._validate(ok) == []
