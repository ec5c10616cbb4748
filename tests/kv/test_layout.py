import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.kv.errors import PlanError
from hwrun.kv.layout import INDEX_KEYS, LATENT, plan_packed_layout
from hwrun.kv.specs import IndexKeySpec, KDAStateSpec, LatentSpec, LayerSpec, ModelSpec
from hwrun.models import get_model

LATENTS = ["bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"]
INDEXES = ["bf16", "fp8", "mxfp4"]


@st.composite
def models(draw):
    """Small hybrid models: MLA layers (some with indexers, some sharing), KDA layers."""
    latent = draw(st.sampled_from(LATENTS))
    index = draw(st.sampled_from(INDEXES))
    kda = KDAStateSpec(heads=8, key_dim=draw(st.sampled_from([32, 64, 128])), value_dim=64)
    kinds = draw(st.lists(st.sampled_from(["mla", "dsa", "shared", "kda"]), min_size=1, max_size=8))
    layers, last_indexer = [], None
    for i, kind in enumerate(["dsa", *kinds]):
        if kind == "kda":
            layers.append(LayerSpec(index=i, kda=kda))
        elif kind == "shared" and last_indexer is not None:
            layers.append(LayerSpec(index=i, latent=LatentSpec(latent), indexer_owner=last_indexer))
        else:
            indexer = IndexKeySpec(index, heads=4) if kind != "mla" else None
            last_indexer = i if indexer else last_indexer
            layers.append(LayerSpec(index=i, latent=LatentSpec(latent), indexer=indexer))
    return ModelSpec("hypothesis", tuple(layers))


@settings(max_examples=60, deadline=None)
@given(
    models(),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([16, 32, 64]),
    st.sampled_from([16, 128, 256, 1024]),
)
def test_pages_tile_the_row_without_overlap_and_stay_aligned(model, tp, kb, alignment):
    layout = plan_packed_layout(model, tp, kernel_block_size=kb, alignment=alignment)
    pages = sorted(layout.pages, key=lambda p: p.offset)
    for page in pages:
        assert page.offset % alignment == 0
        assert page.kernel_page_stride % alignment == 0
        assert page.kernel_page_stride >= page.kernel_page_bytes
        assert page.size == page.kernel_page_stride * (layout.block_size // kb)
        assert page.size >= layout.block_size * page.token_bytes
        assert page.offset >= 0 and page.end <= layout.row_bytes
    for left, right in itertools.pairwise(pages):
        assert left.end <= right.offset
    assert layout.row_bytes % alignment == 0
    assert layout.padding_bytes == layout.row_bytes - sum(
        layout.block_size * p.token_bytes for p in pages
    )
    # the row holds one KDA layer state whole
    assert layout.row_bytes >= layout.kda_state_stride
    assert layout.block_size >= kb and layout.block_size & (layout.block_size - 1) == 0


@settings(max_examples=30, deadline=None)
@given(models(), st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=4, unique=True))
def test_block_sizes_for_different_tp_sizes_divide_evenly(model, tps):
    sizes = sorted(plan_packed_layout(model, tp).block_size for tp in tps)
    assert all(big % small == 0 for small, big in itertools.pairwise(sizes))


def test_block_size_grows_with_the_kda_state_of_smaller_tp():
    model = get_model("kimi-k3.1-pro")
    sizes = {tp: plan_packed_layout(model, tp).block_size for tp in (1, 2, 4, 8)}
    assert sizes == {1: 512, 2: 256, 4: 128, 8: 64}


@pytest.mark.parametrize(
    ("name", "latent", "index"),
    [
        ("kimi-k3.1-pro", None, None),
        ("kimi-k3.1-pro", "nvfp4_ds_mla", "mxfp4"),
        ("mistral-large-4", None, None),
        ("mistral-large-4", "fp8_e4m3", None),
        ("mistral-large-4", "bf16", None),
    ],
)
@pytest.mark.parametrize(("tp", "dcp"), [(8, 1), (8, 8)])
def test_seed_layouts_pad_under_one_percent(name, latent, index, tp, dcp):
    layout = plan_packed_layout(get_model(name).with_formats(latent, index), tp, dcp)
    assert layout.padding_fraction < 0.01


def test_small_kernel_pages_are_padded_and_reported():
    layout = plan_packed_layout(get_model("mistral-large-4"), 8, kernel_block_size=1)
    # 656 and 132 B kernel pages round up to 768 and 256 B
    assert layout.padding_bytes == 63 * (768 - 656) + 44 * (256 - 132)
    assert layout.padding_fraction > 0.1


def test_row_order_block_ranges_and_page_lookup():
    layout = plan_packed_layout(get_model("kimi-k3.1-pro"), 8)
    first, second = layout.pages[0], layout.pages[1]
    assert (first.layer, first.kind, second.layer, second.kind) == (3, LATENT, 3, INDEX_KEYS)
    assert first.offset == 0 and second.offset == 64 * 576
    assert layout.block_byte_range(3) == (3 * layout.row_bytes, 4 * layout.row_bytes)
    assert layout.page(92, INDEX_KEYS).end == layout.row_bytes
    with pytest.raises(ValueError, match="layer 0 owns no latent page"):
        layout.page(0, LATENT)
    assert layout.kda_state_offset(0) == (0, 0)
    assert layout.kda_state_offset(68) == (68, 0)  # one state per row at TP8


def test_forced_block_size_reasons():
    model = get_model("kimi-k3.1-pro")
    with pytest.raises(PlanError, match="use a block size of at least 512"):
        plan_packed_layout(model, 1, block_size=64)
    with pytest.raises(PlanError) as err:
        plan_packed_layout(model, 5, 2, block_size=96, kernel_block_size=48, alignment=100)
    assert len(err.value.reasons) == 5
    assert "96 KDA heads do not divide over TP 5" in str(err.value)
    assert plan_packed_layout(model, 8, block_size=256).block_size == 256
