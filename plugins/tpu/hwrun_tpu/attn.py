"""`attn.lse_combine` as a Pallas kernel: the parts folded in index order, in fp32, as the
contract says (a part whose LSE is -inf adds nothing, every part empty gives out 0 and LSE
-inf). One grid step holds 128 rows of every part; rows are padded to a whole tile with empty
parts, and each element's result depends on its own row only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from hwrun_tpu.bridge import interpret, interpret_mode, to_jax, to_torch, true_divide

ROWS = 128  # rows per grid step


def _combine(outs: jax.Array, lses: jax.Array) -> tuple[jax.Array, jax.Array]:
    """outs [W, R, D], lses [W, R, 1] f32 -> out [R, D], lse [R, 1]."""
    lse_max = jnp.max(lses, axis=0)
    all_empty = lse_max == -jnp.inf
    shift = jnp.where(all_empty, 0.0, lse_max)
    total = jnp.zeros_like(shift)
    acc = jnp.zeros(outs.shape[1:], jnp.float32)
    for w in range(outs.shape[0]):
        weight = jnp.exp(lses[w] - shift)
        total = total + weight
        acc = acc + weight * jnp.where(lses[w] == -jnp.inf, 0.0, outs[w].astype(jnp.float32))
    safe_total = jnp.where(all_empty, 1.0, total)
    out = jnp.where(all_empty, 0.0, true_divide(acc, safe_total))
    return out, jnp.where(all_empty, -jnp.inf, shift + jnp.log(safe_total))


@functools.lru_cache(maxsize=64)
def _combine_call(parts: int, tiles: int, width: int, dtype: str, mode: str | None):
    def kernel(outs_ref, lses_ref, out_ref, lse_ref):
        out_ref[...], lse_ref[...] = _combine(outs_ref[...], lses_ref[...])

    rows = tiles * ROWS
    call = pl.pallas_call(
        kernel,
        grid=(tiles,),
        in_specs=[
            pl.BlockSpec((parts, ROWS, width), lambda t: (0, t, 0)),
            pl.BlockSpec((parts, ROWS, 1), lambda t: (0, t, 0)),
        ],
        out_specs=[
            pl.BlockSpec((ROWS, width), lambda t: (t, 0)),
            pl.BlockSpec((ROWS, 1), lambda t: (t, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((rows, width), jnp.float32),
            jax.ShapeDtypeStruct((rows, 1), jnp.float32),
        ],
        interpret=interpret(mode),
    )
    return jax.jit(call)


def lse_combine(
    outs: torch.Tensor,  # [W, ..., D] float32 / bfloat16 / float16
    lses: torch.Tensor,  # [W, ...] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., D] outs.dtype, lse [...] float32
    if outs.dim() < 2 or lses.shape != outs.shape[:-1] or outs.shape[0] == 0:
        raise ValueError(
            f"outs must be [W, ..., D] and lses [W, ...] with W >= 1; got outs "
            f"{list(outs.shape)}, lses {list(lses.shape)}"
        )
    if bool((lses.isnan() | (lses == float("inf"))).any()):
        raise ValueError("lses must be finite or -inf (an empty part); got +inf or NaN")
    parts, width = outs.shape[0], outs.shape[-1]
    lead = outs.shape[1:-1]
    flat_outs, flat_lses = outs.reshape(parts, -1, width), lses.reshape(parts, -1, 1)
    count = flat_outs.shape[1]
    if count == 0:
        return outs.new_zeros(outs.shape[1:]), lses.new_zeros(lses.shape[1:])
    tiles = -(-count // ROWS)
    pad = tiles * ROWS - count
    flat_outs = torch.nn.functional.pad(flat_outs, (0, 0, 0, pad))
    flat_lses = torch.nn.functional.pad(flat_lses, (0, 0, 0, pad), value=float("-inf"))
    call = _combine_call(parts, tiles, width, str(outs.dtype), interpret_mode())
    out, lse = call(to_jax(flat_outs), to_jax(flat_lses.float()))
    out = to_torch(out)[:count].to(outs.dtype).reshape(*lead, width)
    return out, to_torch(lse)[:count, 0].reshape(lead)
