"""The reference ops read and write the packed cache unchanged, through the kernel-page pool
and translated ids, and agree with the same ops on a plain contiguous cache."""

import pytest
import torch

from hwrun.kv.layout import INDEX_KEYS, LATENT, plan_packed_layout
from hwrun.kv.specs import IndexKeySpec, KDAStateSpec, LatentSpec, LayerSpec, ModelSpec
from hwrun.kv.views import allocate_cache, kernel_page_pool, translate_block_table, translate_slots
from hwrun.ops.indexer import logits_paged, next_n_context_lens
from hwrun.ops.kv_write import write_index_keys, write_latent
from hwrun.ops.sparse_mla import decode

KB = 16  # kernel page tokens, small to keep the test fast


def hybrid(kda_key_dim: int) -> ModelSpec:
    indexer = IndexKeySpec("fp8", heads=4)
    kda = KDAStateSpec(heads=2, key_dim=kda_key_dim, value_dim=64)
    return ModelSpec(
        "hybrid",
        (
            LayerSpec(0, kda=kda),
            LayerSpec(1, latent=LatentSpec("fp8_ds_mla"), indexer=indexer),
            LayerSpec(2, kda=kda),
            LayerSpec(3, latent=LatentSpec("fp8_ds_mla"), indexer=indexer),
        ),
    )


@pytest.mark.parametrize("kda_key_dim", [8, 512])  # one kernel page per block, then several
def test_reference_ops_on_the_packed_cache_match_a_plain_cache(kda_key_dim):
    torch.manual_seed(0)
    layout = plan_packed_layout(hybrid(kda_key_dim), kernel_block_size=KB)
    bs = layout.block_size
    assert bs == (KB if kda_key_dim == 8 else 16 * KB)
    lens = [bs + 5, 2 * bs - 3]  # two requests, tokens over more than one block each
    table = torch.tensor([[4, 1], [0, 3]], dtype=torch.int32)  # packed blocks per request
    cache = allocate_cache(layout, 5)
    latent_page, key_page = layout.page(3, LATENT), layout.page(3, INDEX_KEYS)
    latent_pool = kernel_page_pool(cache, layout, 3, LATENT)
    key_pool = kernel_page_pool(cache, layout, 3, INDEX_KEYS)
    # the plain reference: contiguous KB-token pages, request r's pages at r * pages_per_req
    pages_per_req = 2 * bs // KB
    plain_latent = torch.zeros(2 * pages_per_req, KB, 656, dtype=torch.uint8)
    plain_keys = torch.zeros(2 * pages_per_req, KB * 132, dtype=torch.uint8)
    plain_table = torch.arange(2 * pages_per_req, dtype=torch.int32).view(2, pages_per_req)

    packed_slots, plain_slots = [], []
    for r, n in enumerate(lens):
        pos = torch.arange(n)
        packed_slots.append(table[r, pos // bs].long() * bs + pos % bs)
        plain_slots.append(r * pages_per_req * KB + pos)
    packed_slots, plain_slots = torch.cat(packed_slots), torch.cat(plain_slots)
    tokens = packed_slots.numel()
    nope, rope, keys = torch.randn(tokens, 512), torch.randn(tokens, 64), torch.randn(tokens, 128)

    write_latent(
        latent_pool, nope, rope, translate_slots(layout, latent_page, packed_slots), "fp8_ds_mla"
    )
    write_latent(plain_latent, nope, rope, plain_slots.int(), "fp8_ds_mla")
    write_index_keys(key_pool, keys, translate_slots(layout, key_page, packed_slots), "fp8")
    write_index_keys(plain_keys, keys, plain_slots.int(), "fp8")
    # nothing landed in layer 1's pages of the same rows
    assert not kernel_page_pool(cache, layout, 1, LATENT)[0].any()

    q_idx, w = torch.randn(2, 1, 4, 128), torch.rand(2, 4)
    ctx = next_n_context_lens(torch.tensor(lens, dtype=torch.int32), 1)
    max_ctx = max(lens)
    kernel_table = translate_block_table(layout, key_page, table)
    got = logits_paged(q_idx, w, key_pool, "fp8", kernel_table, ctx, max_ctx)
    want = logits_paged(q_idx, w, plain_keys, "fp8", plain_table, ctx, max_ctx)
    assert torch.equal(got, want)

    # sparse MLA decode over a few positions of each request, -1 padded
    picks = torch.tensor([[0, 3, lens[0] - 1, -1], [1, bs, lens[1] - 1, 7]])
    packed_picks = torch.where(
        picks < 0, -1, table.gather(1, (picks.clamp_min(0) // bs)) * bs + picks % bs
    )
    plain_picks = torch.where(picks < 0, -1, torch.arange(2)[:, None] * pages_per_req * KB + picks)
    q = torch.randn(2, 1, 8, 576)
    kernel_slots = translate_slots(layout, latent_page, packed_picks)[:, None].int()
    out, lse = decode(q, latent_pool, "fp8_ds_mla", kernel_slots, 576**-0.5)
    ref_out, ref_lse = decode(q, plain_latent, "fp8_ds_mla", plain_picks[:, None].int(), 576**-0.5)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
