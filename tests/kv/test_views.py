import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.formats.index_keys import get_index_key_format
from hwrun.formats.latent import get_latent_format
from hwrun.kv.layout import INDEX_KEYS, LATENT, plan_packed_layout
from hwrun.kv.specs import IndexKeySpec, KDAStateSpec, LatentSpec, LayerSpec, ModelSpec
from hwrun.kv.views import (
    allocate_cache,
    index_key_view,
    kda_state_views,
    kernel_id_reasons,
    kernel_page_pool,
    latent_view,
    page_bytes,
    translate_block_table,
    translate_slots,
)
from hwrun.models import get_model


def tiny_model(latent: str, index: str, kda_key_dim: int) -> ModelSpec:
    kda = KDAStateSpec(heads=2, key_dim=kda_key_dim, value_dim=32)
    indexer = IndexKeySpec(index, heads=4)
    return ModelSpec(
        "tiny",
        (
            LayerSpec(0, latent=LatentSpec(latent), indexer=indexer),
            LayerSpec(1, kda=kda),
            LayerSpec(2, latent=LatentSpec(latent), indexer_owner=0),
            LayerSpec(3, latent=LatentSpec(latent), indexer=indexer),
        ),
    )


def raw_token(cache, layout, page, slot):
    """Bytes of one token of ``page`` at packed slot ``slot``, read from the flat cache."""
    block, row = divmod(slot, layout.block_size)
    kernel_page, kernel_row = divmod(row, layout.kernel_block_size)
    start = layout.block_byte_range(block)[0] + page.offset + kernel_page * page.kernel_page_stride
    return cache.view(-1)[start + kernel_row * page.token_bytes :][: page.token_bytes]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"]),
    st.sampled_from(["fp8", "mxfp4"]),
    st.sampled_from([8, 64, 256]),  # KDA key dim: grows the block size past the kernel page
    st.sampled_from([4, 16]),
    st.data(),
)
def test_kernel_pool_writes_land_on_the_raw_bytes_and_back(latent, index, kda_k, kb, data):
    layout = plan_packed_layout(tiny_model(latent, index, kda_k), kernel_block_size=kb)
    num_blocks = 3
    cache = allocate_cache(layout, num_blocks)
    slots = data.draw(
        st.lists(st.integers(0, num_blocks * layout.block_size - 1), min_size=1, max_size=6)
    )
    page = layout.page(data.draw(st.sampled_from([0, 3])), LATENT)
    pool = kernel_page_pool(cache, layout, page.layer, LATENT)
    flat_pool_rows = translate_slots(layout, page, torch.tensor(slots))
    for slot, kernel_slot in zip(slots, flat_pool_rows.tolist(), strict=True):
        value = torch.randint(0, 256, (page.token_bytes,), dtype=torch.uint8)
        pool[kernel_slot // kb, kernel_slot % kb] = value  # write through the kernel view
        assert torch.equal(raw_token(cache, layout, page, slot), value)
        value = torch.randint(0, 256, (page.token_bytes,), dtype=torch.uint8)
        raw_token(cache, layout, page, slot).copy_(value)  # and the reverse
        assert torch.equal(pool[kernel_slot // kb, kernel_slot % kb], value)
    # the block table translation agrees with the slot translation, page by page
    index_page = layout.page(0, INDEX_KEYS)
    table = torch.tensor([[2, -1, 0]], dtype=torch.int32)
    pages = translate_block_table(layout, index_page, table)
    per_block = layout.block_size // kb
    assert pages.shape == (1, 3 * per_block) and pages.dtype == torch.int32
    assert (pages[0, per_block : 2 * per_block] == -1).all()
    slots_of_block2 = torch.arange(0, layout.block_size, kb) + 2 * layout.block_size
    expected = translate_slots(layout, index_page, slots_of_block2) // kb
    assert torch.equal(pages[0, :per_block].long(), expected)
    # every kernel page of the index pool holds the bytes of its packed page
    index_pool = kernel_page_pool(cache, layout, 0, INDEX_KEYS)
    cache.view(-1).copy_(torch.randint(0, 256, (cache.numel(),), dtype=torch.uint8))
    raw = page_bytes(cache, layout, 2, index_page)
    for j in range(per_block):
        got = index_pool[pages[0, j]]
        start = j * index_page.kernel_page_stride
        assert torch.equal(got, raw[start : start + index_page.kernel_page_bytes])


def test_strided_views_decode_what_the_formats_wrote():
    model = get_model("kimi-k3.1-pro").with_formats(latent="fp8_ds_mla", index="mxfp4")
    layout = plan_packed_layout(model, tp=8)
    assert layout.block_size == layout.kernel_block_size == 64
    cache = allocate_cache(layout, 4)
    latent = latent_view(cache, layout, 7)
    keys = index_key_view(cache, layout, 7)
    assert latent.shape == (4, 64, 656) and latent.stride(0) == layout.row_bytes
    assert keys.shape == (4, 64 * 68) and keys.stride(0) == layout.row_bytes
    slots = torch.tensor([5, 64 + 3, 3 * 64 + 63])
    fmt = get_latent_format("fp8_ds_mla")
    nope, rope = torch.randn(3, 512), torch.randn(3, 64)
    rows = fmt.encode(nope, rope)
    latent[slots // 64, slots % 64] = rows  # as kv.write_latent scatters: block, row
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(raw_token(cache, layout, layout.page(7, LATENT), slot), rows[i])
    assert torch.equal(fmt.decode(latent[slots // 64, slots % 64]), fmt.decode(rows))
    key_fmt = get_index_key_format("mxfp4")
    elements, scales = key_fmt.split_pages(keys, 64)
    k = torch.randn(3, 128)
    enc_elements, enc_scales = key_fmt.encode(k)
    elements[slots // 64, slots % 64] = enc_elements
    scales[slots // 64, slots % 64] = enc_scales
    again = key_fmt.split_pages(index_key_view(cache, layout, 7), 64)
    decoded = key_fmt.decode(again[0][slots // 64, slots % 64], again[1][slots // 64, slots % 64])
    assert torch.equal(decoded, key_fmt.decode(enc_elements, enc_scales))
    # nothing leaked into the next page of the row
    assert not page_bytes(cache, layout, 0, layout.page(11, LATENT)).any()


def test_views_refuse_what_they_cannot_show():
    layout = plan_packed_layout(get_model("kimi-k3.1-pro"), tp=1)  # 512-token blocks
    cache = allocate_cache(layout, 1)
    assert latent_view(cache, layout, 3).shape == (1, 512, 576)
    with pytest.raises(ValueError, match="kernel_page_pool"):
        index_key_view(cache, layout, 3)
    with pytest.raises(ValueError, match=r"uint8 cache \[num_blocks, 8699904\]"):
        latent_view(cache[:, :10], layout, 3)
    padded = plan_packed_layout(get_model("mistral-large-4"), 8, kernel_block_size=1)
    with pytest.raises(ValueError, match="padded"):
        latent_view(allocate_cache(padded, 1), padded, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        allocate_cache(layout, 0)


def test_kernel_page_ids_fit_int32_until_they_do_not():
    layout = plan_packed_layout(get_model("kimi-k3.1-pro"), tp=8)
    assert kernel_id_reasons(layout, 47_500) == []  # the seed's 51.7 GB pool per GPU
    assert "past int32" in kernel_id_reasons(layout, 600_000)[0]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([8, 32, 64, 256]), st.sampled_from([1, 2]), st.integers(1, 9))
def test_kda_states_fill_their_rows_without_overlap(kda_k, tp, num_kda):
    kda = KDAStateSpec(heads=2, key_dim=kda_k, value_dim=32)
    layers = [LayerSpec(0, latent=LatentSpec("fp8_e4m3"), indexer=IndexKeySpec("fp8", heads=4))]
    layers += [LayerSpec(1 + i, kda=kda) for i in range(num_kda)]
    layout = plan_packed_layout(ModelSpec("kda", tuple(layers)), tp)
    state_rows = [5, 1, 3, 0, 2, 4, 6, 7, 8][: layout.state_rows_per_request]
    cache = allocate_cache(layout, 9)
    for ordinal in range(num_kda):
        recurrent, conv = kda_state_views(cache, layout, state_rows, ordinal, kda)
        assert recurrent.shape == (2 // tp, kda_k, 32) and recurrent.dtype == torch.float32
        assert conv.shape == ((2 * kda_k + 32) * 2 // tp, 3) and conv.dtype == torch.bfloat16
        before = cache.clone()
        recurrent.fill_(float(ordinal + 1))
        conv.fill_(-1.0)
        changed = (cache != before).view(-1).nonzero().flatten()
        # everything written lies in this state's slot of its row, and nothing else moved
        row, offset = layout.kda_state_offset(ordinal)
        start = layout.block_byte_range(state_rows[row])[0] + offset
        assert changed.min() >= start and changed.max() < start + layout.kda_state_stride
        assert offset + layout.kda_state_stride <= layout.row_bytes
    for ordinal in range(num_kda):  # no later state overwrote an earlier one
        recurrent, _ = kda_state_views(cache, layout, state_rows, ordinal, kda)
        assert (recurrent == ordinal + 1).all()
    with pytest.raises(ValueError, match="state rows were given"):
        kda_state_views(cache, layout, [], 0, kda)
