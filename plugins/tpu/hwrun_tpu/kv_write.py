"""`kv.write_latent` and `kv.write_index_keys` as Pallas kernels: quantize one token per grid
step in VMEM and DMA its bytes to its slot of the paged cache (the slots arrive through scalar
prefetch, as TPU paged kernels take their block tables).

The bytes are the reference's (``hwrun.formats``; the conformance cases compare them exactly).
The cache crosses into JAX through DLPack; JAX arrays are immutable, so the kernel writes an
aliased copy and the slots it wrote are copied back into the torch cache (rows for the latent,
whole blocks for the block-major index-key pages). Negative slots are dropped on the host
before the launch; a slot past the cache or a repeated slot raises, as in the contract.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from hwrun.formats.fp8 import E4M3_MAX
from hwrun.formats.index_keys import AMAX_FLOOR, get_index_key_format
from hwrun.formats.latent import DS_MLA_TILE, FLT_MIN, NOPE_DIM, ROPE_DIM, get_latent_format
from hwrun_tpu import kernel_formats as kf
from hwrun_tpu.bridge import interpret, interpret_mode, to_jax, to_torch, true_divide

LATENT_FORMATS = ("fp8_ds_mla", "bf16")
INDEX_KEY_FORMATS = ("fp8", "bf16")


def _kept_slots(slots: torch.Tensor, tokens: int, capacity: int) -> torch.Tensor:
    """Indices of the tokens to write, after the contract's checks on ``slots``."""
    if slots.dtype not in (torch.int32, torch.int64) or slots.shape != (tokens,):
        raise ValueError(f"slots must be int32 [T={tokens}], got {slots.dtype} {list(slots.shape)}")
    if bool((slots >= capacity).any()):
        raise ValueError(f"slots must be < {capacity} (num_blocks * block_size)")
    kept = torch.nonzero(slots >= 0).flatten()
    if slots[kept].unique().numel() != kept.numel():
        raise ValueError("each slot may be written at most once per call; got a repeated slot")
    return kept


def _latent_row(nope: jax.Array, rope: jax.Array, fmt: str) -> jax.Array:
    """[1, 512] and [1, 64] float32 -> [1, row_bytes] uint8 (hwrun.formats.latent's rule)."""
    if fmt == "bf16":
        return kf.bf16_bytes(jnp.concatenate((nope, rope), axis=-1))
    tiles = nope.reshape(NOPE_DIM // DS_MLA_TILE, DS_MLA_TILE)
    amax = jnp.max(jnp.abs(tiles), axis=-1, keepdims=True)  # NaN propagates
    scales = jnp.maximum(true_divide(amax, E4M3_MAX), FLT_MIN)
    scales = jnp.where(jnp.isnan(amax), amax, scales)
    codes = kf.e4m3_codes(true_divide(tiles, scales)).reshape(1, NOPE_DIM)
    return jnp.concatenate(
        (codes, kf.f32_bytes(scales.reshape(1, -1)), kf.bf16_bytes(rope)), axis=-1
    )


@functools.lru_cache(maxsize=64)
def _latent_call(tokens: int, capacity: int, row_bytes: int, fmt: str, mode: str | None):
    def kernel(slots_ref, nope_ref, rope_ref, cache_in, cache_out, row, sem):
        del cache_in  # aliased with cache_out: rows no slot names keep their bytes
        t = pl.program_id(0)
        row[...] = _latent_row(nope_ref[0], rope_ref[0], fmt)
        copy = pltpu.make_async_copy(row, cache_out.at[pl.ds(slots_ref[t], 1)], sem)
        copy.start()
        copy.wait()

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(tokens,),
            in_specs=[
                pl.BlockSpec((1, 1, NOPE_DIM), lambda t, slots: (t, 0, 0)),
                pl.BlockSpec((1, 1, ROPE_DIM), lambda t, slots: (t, 0, 0)),
                pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM),
            ],
            out_specs=pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM),
            scratch_shapes=[pltpu.VMEM((1, row_bytes), jnp.uint8), pltpu.SemaphoreType.DMA],
        ),
        out_shape=jax.ShapeDtypeStruct((capacity, row_bytes), jnp.uint8),
        input_output_aliases={3: 0},
        interpret=interpret(mode),
    )
    return jax.jit(call)


def write_latent(
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8 (may be a strided view)
    nope: torch.Tensor,  # [T, 512]
    rope: torch.Tensor,  # [T, 64]
    slots: torch.Tensor,  # [T] int32, negative = skip
    fmt: str,  # "fp8_ds_mla" or "bf16"
    scale: float | None = None,
) -> None:
    if fmt not in LATENT_FORMATS:
        raise ValueError(f"latent format {fmt!r} has no Pallas kernel; supported: {LATENT_FORMATS}")
    if scale is not None:
        raise ValueError(f"latent format {fmt!r} carries its scales in the row: pass scale=None")
    row_bytes = get_latent_format(fmt).row_bytes
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != row_bytes:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size, {row_bytes}] for {fmt!r}, got "
            f"{cache.dtype} {list(cache.shape)}"
        )
    block_size = cache.shape[1]
    capacity = cache.shape[0] * block_size
    kept = _kept_slots(slots, nope.shape[0], capacity)
    if kept.numel() == 0:
        return
    written = slots[kept].long()
    call = _latent_call(kept.numel(), capacity, row_bytes, fmt, interpret_mode())
    new = call(
        to_jax(written),
        to_jax(nope[kept].float()[:, None, :]),
        to_jax(rope[kept].float()[:, None, :]),
        to_jax(cache.reshape(capacity, row_bytes)),
    )
    rows = to_torch(new)[written]
    cache[written // block_size, written % block_size] = rows


def _index_key_bytes(keys: jax.Array, fmt: str) -> tuple[jax.Array, jax.Array]:
    """[1, 128] float32 -> elements [1, element_bytes], scale bytes [1, scale_bytes] uint8."""
    if fmt == "bf16":
        return kf.bf16_bytes(keys), jnp.zeros((1, 0), jnp.uint8)
    amax = jnp.max(jnp.abs(keys), axis=-1, keepdims=True)
    scale = kf.fp8_scale(amax, AMAX_FLOOR, ue8m0=True)
    return kf.e4m3_codes(keys / scale), kf.f32_bytes(scale)


@functools.lru_cache(maxsize=64)
def _index_key_call(tokens: int, num_blocks: int, block_size: int, fmt: str, mode: str | None):
    key_format = get_index_key_format(fmt)
    eb, sb = key_format.element_bytes, key_format.scale_bytes
    scale_base = block_size * eb

    def kernel(slots_ref, keys_ref, cache_in, cache_out, elements, scales, sems):
        del cache_in  # aliased with cache_out
        slot = slots_ref[pl.program_id(0)]
        block, offset = slot // block_size, slot % block_size
        elements[...], scale_bytes = _index_key_bytes(keys_ref[0], fmt)
        copies = [
            pltpu.make_async_copy(
                elements, cache_out.at[pl.ds(block, 1), pl.ds(offset * eb, eb)], sems.at[0]
            )
        ]
        if sb:
            scales[...] = scale_bytes
            target = cache_out.at[pl.ds(block, 1), pl.ds(scale_base + offset * sb, sb)]
            copies.append(pltpu.make_async_copy(scales, target, sems.at[1]))
        for copy in copies:
            copy.start()
        for copy in copies:
            copy.wait()

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(tokens,),
            in_specs=[
                pl.BlockSpec((1, 1, 128), lambda t, slots: (t, 0, 0)),
                pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM),
            ],
            out_specs=pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM),
            scratch_shapes=[
                pltpu.VMEM((1, eb), jnp.uint8),
                pltpu.VMEM((1, max(sb, 1)), jnp.uint8),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(
            (num_blocks, block_size * key_format.bytes_per_token), jnp.uint8
        ),
        input_output_aliases={2: 0},
        interpret=interpret(mode),
    )
    return jax.jit(call)


def write_index_keys(
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8 (may be strided)
    keys: torch.Tensor,  # [T, 128]
    slots: torch.Tensor,  # [T] int32, negative = skip
    fmt: str,  # "fp8" or "bf16"
) -> None:
    if fmt not in INDEX_KEY_FORMATS:
        raise ValueError(
            f"index-key format {fmt!r} has no Pallas kernel; supported: {INDEX_KEY_FORMATS}"
        )
    bpt = get_index_key_format(fmt).bytes_per_token
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] % bpt != 0:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size * {bpt}] for {fmt!r}, got "
            f"{cache.dtype} {list(cache.shape)}"
        )
    if keys.dim() != 2 or keys.shape[1] != 128:
        raise ValueError(f"keys must be [T, 128], got {list(keys.shape)}")
    num_blocks, block_size = cache.shape[0], cache.shape[1] // bpt
    kept = _kept_slots(slots, keys.shape[0], num_blocks * block_size)
    if kept.numel() == 0:
        return
    written = slots[kept].long()
    call = _index_key_call(kept.numel(), num_blocks, block_size, fmt, interpret_mode())
    new = call(to_jax(written), to_jax(keys[kept].float()[:, None, :]), to_jax(cache))
    blocks = (written // block_size).unique()
    cache[blocks] = to_torch(new)[blocks]
