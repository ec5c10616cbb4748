"""`indexer.topk` as a Pallas kernel: an exact radix select per row (the selection half of the
TPU's SparseCore step; :mod:`hwrun_tpu.gather` is the other half).

Each grid step holds one row in VMEM. Scores become order-preserving 32-bit keys (-0.0 equals
+0.0, NaN counts as -inf, columns outside ``[start, end)`` get key 0, below every column
inside); 32 counting passes find the k-th largest key bit by bit, as a radix select does; the
columns above it are taken, then those equal to it in index order until k are taken (the
contract's smallest-index rule, so the chosen set is the reference's exactly). A prefix sum
places them: the output row lists the chosen columns in index order (the contract compares
sets), -1 after them when the row holds fewer than k columns.

The prefix sum and the scatter that compact the row are SparseCore work on a TPU: this kernel
is written so that a SparseCore kernel can take its place; run on a TensorCore it is only
checked in the interpret mode.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from hwrun_tpu.bridge import interpret, interpret_mode, to_jax, to_torch

SIGN = 0x80000000


def _order_keys(scores: jax.Array) -> jax.Array:  # [L] float32 -> [L] uint32, order-preserving
    scores = jnp.where(jnp.isnan(scores), -jnp.inf, scores)
    scores = jnp.where(scores == 0.0, 0.0, scores)  # -0.0 as +0.0 (XLA folds away x + 0.0)
    bits = lax.bitcast_convert_type(scores, jnp.uint32)
    sign = jnp.uint32(SIGN)
    return jnp.where(bits >= sign, ~bits, bits | sign)


def _select_row(scores: jax.Array, start: jax.Array, end: jax.Array, k: int) -> jax.Array:
    """[L] float32 -> [k] int32: the chosen columns relative to ``start``, then -1."""
    column = lax.broadcasted_iota(jnp.int32, scores.shape, 0)
    inside = (column >= start) & (column < end)
    keys = jnp.where(inside, _order_keys(scores), jnp.uint32(0))

    def refine(bit, threshold):
        candidate = threshold | (jnp.uint32(1) << (31 - bit).astype(jnp.uint32))
        enough = jnp.sum((keys >= candidate).astype(jnp.int32)) >= k
        return jnp.where(enough, candidate, threshold)

    kth = lax.fori_loop(0, 32, refine, jnp.uint32(0))  # the k-th largest key (0: fewer than k)
    above = keys > kth
    ties = inside & (keys == kth)
    room = k - jnp.sum(above.astype(jnp.int32))
    tie_rank = jnp.cumsum(ties.astype(jnp.int32)) - 1
    chosen = above | (ties & (tie_rank < room))
    place = jnp.where(chosen, jnp.cumsum(chosen.astype(jnp.int32)) - 1, k)
    out = jnp.full((k,), -1, jnp.int32)
    return out.at[place].set(column - start, mode="drop")


@functools.lru_cache(maxsize=64)
def _topk_call(rows: int, length: int, k: int, mode: str | None):
    def kernel(starts_ref, ends_ref, logits_ref, out_ref):
        r = pl.program_id(0)
        out_ref[0, 0] = _select_row(logits_ref[0, 0], starts_ref[r], ends_ref[r], k)

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(rows,),
            in_specs=[pl.BlockSpec((1, 1, length), lambda r, s, e: (r, 0, 0))],
            out_specs=pl.BlockSpec((1, 1, k), lambda r, s, e: (r, 0, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct((rows, 1, k), jnp.int32),
        interpret=interpret(mode),
    )
    return jax.jit(call)


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
) -> torch.Tensor:  # [R, k] int32, relative to each row's start, -1 past a short row
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be float32 [R, L], got {logits.dtype} {list(logits.shape)}")
    rows, length = logits.shape
    if bool(((starts < 0) | (ends < starts) | (ends > length)).any()):
        raise ValueError(f"every row needs 0 <= start <= end <= L={length}")
    if rows == 0 or length == 0:
        return torch.full((rows, k), -1, dtype=torch.int32)
    call = _topk_call(rows, length, k, interpret_mode())
    out = call(
        to_jax(starts.to(torch.int32)), to_jax(ends.to(torch.int32)), to_jax(logits[:, None, :])
    )
    return to_torch(out)[:, 0, :]
