"""`indexer.logits_paged` and `indexer.logits_ragged` as Pallas kernels (the TensorCore step of
the TPU's DSA path): the index keys are decoded in VMEM and scored on the matrix unit.

Paged: one grid step per (request, page); the block table and the context lengths arrive
through scalar prefetch, and the page's BlockSpec index map reads the table, so each step's
page is DMA'd from wherever the table points (as TPU paged attention does). Table entries
past a context (-1, unallocated) are clamped to page 0 and their scores masked. Ragged: one
grid step per (query row, tile of 128 keys); the row's [ks, ke) range masks the scores.

Scores are ``sum_h w[h] * relu(q[h] . k)`` in fp32 with an fp32 matmul (``HIGHEST``
precision); fp8 query codes cross as bytes and are decoded in the kernel. Every step computes
one fixed shape, so a row's scores do not depend on the rest of the batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from hwrun.formats.index_keys import get_index_key_format
from hwrun.ops.indexer import INDEX_HEAD_DIM
from hwrun_tpu import kernel_formats as kf
from hwrun_tpu.bridge import interpret, interpret_mode, to_jax, to_torch

INDEX_KEY_FORMATS = ("fp8", "bf16")
QUERY_DTYPES = ("bfloat16", "float32", "float8_e4m3fn")
KEY_TILE = 128  # keys per ragged grid step: one lane-width of scores


def _keys(elements: jax.Array, scales: jax.Array | None, fmt: str) -> jax.Array:
    """[n, element_bytes] uint8 (+ [n, 1] float32 scales) -> [n, 128] float32."""
    if fmt == "bf16":
        return kf.bf16_from_bytes(elements)
    return kf.e4m3_values(elements) * scales


def _query(q: jax.Array, fp8: bool) -> jax.Array:
    return kf.e4m3_values(q) if fp8 else q.astype(jnp.float32)


def _scores(q: jax.Array, w: jax.Array, keys: jax.Array) -> jax.Array:
    """q [R*H, 128], w [R, H], keys [n, 128] float32 -> [R, n] float32."""
    dots = jax.lax.dot_general(
        q,
        keys,
        (((1,), (1,)), ((), ())),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    rows, heads = w.shape
    dots = jnp.maximum(dots, 0.0).reshape(rows, heads, -1)
    return jnp.sum(dots * w[:, :, None], axis=1)


def _check_paged(
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    block_size: int,
    max_ctx: int,
) -> None:
    """The contract's refusals: a length past max_ctx or the table, a context that reaches an
    unallocated (-1) table entry (the kernel would read page 0 there)."""
    capacity = block_table.shape[1] * block_size
    if bool(((context_lens < 0) | (context_lens > min(max_ctx, capacity))).any()):
        raise ValueError(
            f"context_lens must lie in [0, min(max_ctx={max_ctx}, max_blocks * block_size="
            f"{capacity})], got {context_lens.tolist()}"
        )
    needed = -(-context_lens.amax(dim=1, keepdim=True) // block_size)  # [B, 1] blocks read
    reached = torch.arange(block_table.shape[1])[None, :] < needed
    if bool((reached & (block_table < 0)).any()):
        raise ValueError("a context reaches an unallocated block-table entry (< 0)")


@functools.lru_cache(maxsize=64)
def _paged_call(
    batch, next_n, heads, fp8_q, num_blocks, block_size, max_blocks, steps, fmt, mode: str | None
):
    key_format = get_index_key_format(fmt)
    width = block_size * key_format.bytes_per_token
    split = block_size * key_format.element_bytes

    def page_index(b, j, table, lens):
        return (table[b * max_blocks + jnp.minimum(j, max_blocks - 1)], 0, 0)

    def kernel(table_ref, lens_ref, q_ref, w_ref, page_ref, out_ref):
        b, j = pl.program_id(0), pl.program_id(1)
        page = page_ref[0, 0]
        elements = page[:split].reshape(block_size, key_format.element_bytes)
        scales = None
        if key_format.scale_bytes:
            scales = kf.f32_from_bytes(page[split:].reshape(block_size, 4))
        scores = _scores(_query(q_ref[0], fp8_q), w_ref[0], _keys(elements, scales, fmt))
        lens = jnp.stack([lens_ref[b * next_n + i] for i in range(next_n)])[:, None]
        position = j * block_size + jax.lax.broadcasted_iota(jnp.int32, (1, block_size), 1)
        out_ref[0, :, 0, 0, :] = jnp.where(position < lens, scores, -jnp.inf)

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch, steps),
            in_specs=[
                pl.BlockSpec((1, next_n * heads, INDEX_HEAD_DIM), lambda b, j, t, n: (b, 0, 0)),
                pl.BlockSpec((1, next_n, heads), lambda b, j, t, n: (b, 0, 0)),
                pl.BlockSpec((1, 1, width), page_index),
            ],
            out_specs=pl.BlockSpec(
                (1, next_n, 1, 1, block_size), lambda b, j, t, n: (b, 0, j, 0, 0)
            ),
        ),
        out_shape=jax.ShapeDtypeStruct((batch, next_n, steps, 1, block_size), jnp.float32),
        interpret=interpret(mode),
    )
    return jax.jit(call)


def logits_paged(
    q: torch.Tensor,  # [B, n, H, 128] bfloat16 / float32 or float8_e4m3fn codes
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8
    fmt: str,  # "fp8" or "bf16"
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf at and past each row's length
    if fmt not in INDEX_KEY_FORMATS:
        raise ValueError(
            f"index-key format {fmt!r} has no Pallas kernel; supported: {INDEX_KEY_FORMATS}"
        )
    batch, next_n, heads, _ = q.shape
    bpt = get_index_key_format(fmt).bytes_per_token
    num_blocks, block_size = cache.shape[0], cache.shape[1] // bpt
    max_blocks = block_table.shape[1]
    _check_paged(block_table, context_lens, block_size, max_ctx)
    if batch == 0 or max_ctx == 0:
        return torch.full((batch * next_n, max_ctx), float("-inf"))
    steps = -(-max_ctx // block_size)
    table = block_table.clamp(min=0).to(torch.int32).flatten()
    call = _paged_call(
        batch,
        next_n,
        heads,
        q.dtype == torch.float8_e4m3fn,
        num_blocks,
        block_size,
        max_blocks,
        steps,
        fmt,
        interpret_mode(),
    )
    out = call(
        to_jax(table),
        to_jax(context_lens.to(torch.int32).flatten()),
        to_jax(q.reshape(batch, next_n * heads, INDEX_HEAD_DIM)),
        to_jax(weights.float().reshape(batch, next_n, heads)),
        to_jax(cache.reshape(num_blocks, 1, -1)),
    )
    return to_torch(out).reshape(batch * next_n, steps * block_size)[:, :max_ctx]


@functools.lru_cache(maxsize=64)
def _ragged_call(rows, heads, fp8_q, tiles, fmt, mode: str | None):
    element_bytes = get_index_key_format(fmt).element_bytes

    def kernel(ks_ref, ke_ref, q_ref, w_ref, elements_ref, scales_ref, out_ref):
        i, t = pl.program_id(0), pl.program_id(1)
        keys = _keys(elements_ref[...], scales_ref[...], fmt)
        scores = _scores(_query(q_ref[0], fp8_q), w_ref[0], keys)
        column = t * KEY_TILE + jax.lax.broadcasted_iota(jnp.int32, (1, KEY_TILE), 1)
        inside = (column >= ks_ref[i]) & (column < ke_ref[i])
        out_ref[0] = jnp.where(inside, scores, -jnp.inf)

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(rows, tiles),
            in_specs=[
                pl.BlockSpec((1, heads, INDEX_HEAD_DIM), lambda i, t, ks, ke: (i, 0, 0)),
                pl.BlockSpec((1, 1, heads), lambda i, t, ks, ke: (i, 0, 0)),
                pl.BlockSpec((KEY_TILE, element_bytes), lambda i, t, ks, ke: (t, 0)),
                pl.BlockSpec((KEY_TILE, 1), lambda i, t, ks, ke: (t, 0)),
            ],
            out_specs=pl.BlockSpec((1, 1, KEY_TILE), lambda i, t, ks, ke: (i, 0, t)),
        ),
        out_shape=jax.ShapeDtypeStruct((rows, 1, tiles * KEY_TILE), jnp.float32),
        interpret=interpret(mode),
    )
    return jax.jit(call)


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128] bfloat16 / float32 or float8_e4m3fn codes
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, element_bytes] uint8
    key_scales: torch.Tensor,  # [N, scale_bytes] uint8
    fmt: str,  # "fp8" or "bf16"
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    if fmt not in INDEX_KEY_FORMATS:
        raise ValueError(
            f"index-key format {fmt!r} has no Pallas kernel; supported: {INDEX_KEY_FORMATS}"
        )
    rows, heads, _ = q.shape
    num_keys = key_elements.shape[0]
    if bool(((ks < 0) | (ke < ks) | (ke > num_keys)).any()):
        raise ValueError(f"every row needs 0 <= ks <= ke <= N={num_keys}")
    if rows == 0 or num_keys == 0:
        return torch.full((rows, num_keys), float("-inf"))
    tiles = -(-num_keys // KEY_TILE)
    pad = tiles * KEY_TILE - num_keys
    elements = torch.nn.functional.pad(key_elements, (0, 0, 0, pad))
    if fmt == "bf16":
        scales = torch.ones(tiles * KEY_TILE, 1)
    else:
        scales = key_scales.contiguous().view(torch.float32)
        scales = torch.nn.functional.pad(scales, (0, 0, 0, pad), value=1.0)
    call = _ragged_call(rows, heads, q.dtype == torch.float8_e4m3fn, tiles, fmt, interpret_mode())
    out = call(
        to_jax(ks.to(torch.int32)),
        to_jax(ke.to(torch.int32)),
        to_jax(q),
        to_jax(weights.float()[:, None, :]),
        to_jax(elements),
        to_jax(scales),
    )
    return to_torch(out)[:, 0, :num_keys]
