"""kv.write_latent / kv.write_index_keys: bytes at each slot, skipped slots, guard bytes, errors."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.index_keys import INDEX_KEY_FORMATS
from hwrun.formats.latent import LATENT_FORMATS
from hwrun.ops import kv_write

GUARD = 0xA5


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fmt", sorted(LATENT_FORMATS))
def test_write_latent_stores_the_encoded_rows_and_nothing_else(fmt):
    row_bytes, block_size, num_blocks = LATENT_FORMATS[fmt].row_bytes, 8, 4
    scale = 2.0 if fmt == "fp8_e4m3" else None
    packed = torch.full((num_blocks, block_size * row_bytes + 24), GUARD, dtype=torch.uint8)
    cache = packed[:, : block_size * row_bytes].unflatten(1, (block_size, row_bytes))
    latent = _randn(6, 576, seed=1).bfloat16()
    slots = torch.tensor([9, -1, 31, 0, -7, 17], dtype=torch.int32)
    kv_write.write_latent(cache, latent[:, :512], latent[:, 512:], slots, fmt, scale)
    expected = LATENT_FORMATS[fmt].encode(latent[:, :512], latent[:, 512:], scale)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(cache[slot // block_size, slot % block_size], expected[t])
            written[slot] = True
    untouched = cache.reshape(-1, row_bytes)[~written]
    assert bool((untouched == GUARD).all())
    assert bool((packed[:, block_size * row_bytes :] == GUARD).all())  # the gap after each block


@pytest.mark.parametrize("fmt", sorted(INDEX_KEY_FORMATS))
def test_write_index_keys_uses_deepgemm_block_major_pages(fmt):
    key_format = INDEX_KEY_FORMATS[fmt]
    block_size, num_blocks = 4, 3
    eb, sb = key_format.element_bytes, key_format.scale_bytes
    buffer = torch.full(
        (num_blocks, block_size * key_format.bytes_per_token + 16), GUARD, dtype=torch.uint8
    )
    cache = buffer[:, : block_size * key_format.bytes_per_token]
    keys = _randn(5, 128, seed=2)
    slots = torch.tensor([5, 0, -1, 11, 6], dtype=torch.int32)
    kv_write.write_index_keys(cache, keys, slots, fmt)
    elements, scales = key_format.encode(keys)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        block, row = divmod(slot, block_size)
        # Page: all element rows of the block, then all scale rows.
        assert torch.equal(cache[block, row * eb : (row + 1) * eb], elements[t])
        base = block_size * eb
        assert torch.equal(cache[block, base + row * sb : base + (row + 1) * sb], scales[t])
    page_elements, page_scales = key_format.split_pages(cache, block_size)
    assert bool((page_elements[0, 1:] == GUARD).all())  # rows 1..3 of block 0 untouched
    assert bool((buffer[:, cache.shape[1] :] == GUARD).all())
    decoded = key_format.decode(page_elements[1, 1], page_scales[1, 1])  # slot 5 = token 0
    assert torch.equal(decoded, key_format.decode(elements[0], scales[0]))


def test_all_slots_skipped_writes_nothing():
    cache = torch.full((2, 4, 656), GUARD, dtype=torch.uint8)
    latent = torch.ones(3, 576)
    kv_write.write_latent(
        cache, latent[:, :512], latent[:, 512:], torch.full((3,), -1), "fp8_ds_mla"
    )
    assert bool((cache == GUARD).all())


def test_write_latent_bad_input():
    cache = torch.zeros(2, 4, 656, dtype=torch.uint8)
    nope, rope = torch.zeros(3, 512), torch.zeros(3, 64)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="slots must be < 8"):
        kv_write.write_latent(cache, nope, rope, slots + 6, "fp8_ds_mla")
    with pytest.raises(ValueError, match="at most once"):
        kv_write.write_latent(cache, nope, rope, slots * 0, "fp8_ds_mla")
    with pytest.raises(ValueError, match="slots must be int32 \\[T=3\\]"):
        kv_write.write_latent(cache, nope, rope, slots[:2], "fp8_ds_mla")
    with pytest.raises(ValueError, match="rope must have T=3 rows"):
        kv_write.write_latent(cache, nope, rope[:2], slots, "fp8_ds_mla")
    with pytest.raises(ValueError, match="nope must be a float \\[T, 512\\]"):
        kv_write.write_latent(cache, nope[:, :500], rope, slots, "fp8_ds_mla")
    with pytest.raises(ValueError, match="cache must be uint8 \\[num_blocks, block_size, 352\\]"):
        kv_write.write_latent(cache, nope, rope, slots, "nvfp4_ds_mla")
    with pytest.raises(ValueError, match="unknown latent format"):
        kv_write.write_latent(cache, nope, rope, slots, "fp8")


def test_write_index_keys_bad_input():
    cache = torch.zeros(2, 4 * 132, dtype=torch.uint8)
    keys = torch.zeros(2, 128)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="slots must be < 8"):
        kv_write.write_index_keys(cache, keys, slots + 7, "fp8")
    with pytest.raises(ValueError, match="keys must be a float \\[T, 128\\]"):
        kv_write.write_index_keys(cache, torch.zeros(2, 64), slots, "fp8")
    with pytest.raises(ValueError, match="cache must be uint8 \\[num_blocks, block_size \\* 68\\]"):
        kv_write.write_index_keys(cache[:, :100], keys, slots, "mxfp4")
    with pytest.raises(ValueError, match="slots must be int32"):
        kv_write.write_index_keys(cache, keys, slots.float(), "fp8")
