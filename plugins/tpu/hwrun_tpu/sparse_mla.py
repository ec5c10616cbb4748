"""`sparse_mla.decode` and `sparse_mla.prefill` as dense attention over gathered rows: the
TPU's DSA path. :mod:`hwrun_tpu.gather` (the SparseCore step) copies each row's selected
latent rows into a dense ``[rows, k, row_bytes]`` buffer; the attention kernel here (the
TensorCore step) decodes the buffer in VMEM and runs softmax attention over it on the matrix
unit, with the contract's natural-log LSE.

Rows are decoded as ``hwrun.formats.latent`` says: ``fp8_ds_mla`` as e4m3 codes times the
tile's scale rounded to bf16, the product rounded to bf16 (FlashMLA's decode), its RoPE as
bf16; ``bf16`` rows as they are. Prefill reads its bf16 workspace as ``bf16`` latent rows and
an fp32 workspace as fp32 rows, through the same two kernels. Entries that are -1 or past
``topk_length`` are masked; a row with none is out 0, LSE -inf. The sink scales the output
by ``sigmoid(lse - sink)`` and leaves the LSE. Each grid step is one query row of one fixed
shape, so rows are batch-invariant.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from hwrun.formats.latent import DS_MLA_TILE, LATENT_DIM, NOPE_DIM, get_latent_format
from hwrun_tpu import kernel_formats as kf
from hwrun_tpu.bridge import interpret, interpret_mode, to_jax, to_torch, true_divide
from hwrun_tpu.gather import gather_rows

LATENT_FORMATS = ("fp8_ds_mla", "bf16")
WORKSPACE_DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}
ROW_BYTES = {"f32": 4 * LATENT_DIM} | {f: get_latent_format(f).row_bytes for f in LATENT_FORMATS}


def _decode_rows(rows: jax.Array, fmt: str) -> jax.Array:  # [k, row_bytes] -> [k, 576] f32
    if fmt == "bf16":
        return kf.bf16_from_bytes(rows)
    if fmt == "f32":
        return kf.f32_from_bytes(rows)
    k = rows.shape[0]
    codes = kf.e4m3_values(rows[:, :NOPE_DIM]).reshape(k, -1, DS_MLA_TILE)
    scales = kf.f32_from_bytes(rows[:, NOPE_DIM : NOPE_DIM + 16])
    scales = scales.astype(jnp.bfloat16).astype(jnp.float32)[:, :, None]
    nope = (codes * scales).astype(jnp.bfloat16).astype(jnp.float32).reshape(k, NOPE_DIM)
    return jnp.concatenate((nope, kf.bf16_from_bytes(rows[:, NOPE_DIM + 16 :])), axis=-1)


def _attend(q, kv, valid, softmax_scale, sink):
    """q [H, 576], kv [k, 576] f32, valid [1, k] bool -> out [H, 512], lse [H] (f32)."""
    scores = jax.lax.dot_general(
        q,
        kv,
        (((1,), (1,)), ((), ())),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    scores = jnp.where(valid, scores * softmax_scale, -jnp.inf)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    empty = peak == -jnp.inf
    peak = jnp.where(empty, 0.0, peak)
    p = jnp.exp(scores - peak)  # 0 at masked entries
    total = jnp.sum(p, axis=-1, keepdims=True)
    out = jax.lax.dot_general(
        p,
        kv[:, :NOPE_DIM],
        (((1,), (0,)), ((), ())),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    out = jnp.where(empty, 0.0, true_divide(out, jnp.where(empty, 1.0, total)))
    lse = jnp.where(empty, -jnp.inf, peak + jnp.log(jnp.where(empty, 1.0, total)))
    if sink is not None:
        out = out * jax.nn.sigmoid(lse - sink[:, None])
    return out, lse[:, 0]


@functools.lru_cache(maxsize=64)
def _attention_call(
    rows: int, heads: int, k: int, fmt: str, softmax_scale: float, sink: bool, mode: str | None
):
    row_bytes = ROW_BYTES[fmt]

    def kernel(q_ref, rows_ref, valid_ref, sink_ref, out_ref, lse_ref):
        kv = _decode_rows(rows_ref[0], fmt)
        out, lse = _attend(
            q_ref[0].astype(jnp.float32),
            kv,
            valid_ref[0] != 0,
            softmax_scale,
            sink_ref[0] if sink else None,
        )
        out_ref[0] = out
        lse_ref[0, 0] = lse

    call = pl.pallas_call(
        kernel,
        grid=(rows,),
        in_specs=[
            pl.BlockSpec((1, heads, LATENT_DIM), lambda r: (r, 0, 0)),
            pl.BlockSpec((1, k, row_bytes), lambda r: (r, 0, 0)),
            pl.BlockSpec((1, 1, k), lambda r: (r, 0, 0)),
            pl.BlockSpec((1, heads), lambda r: (0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((1, heads, NOPE_DIM), lambda r: (r, 0, 0)),
            pl.BlockSpec((1, 1, heads), lambda r: (r, 0, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((rows, heads, NOPE_DIM), jnp.float32),
            jax.ShapeDtypeStruct((rows, 1, heads), jnp.float32),
        ],
        interpret=interpret(mode),
    )
    return jax.jit(call)


def _masked(
    indices: torch.Tensor,  # [R, k] int, -1 = invalid
    topk_length: torch.Tensor | None,  # [R] int
    limit: int,
    what: str,
) -> torch.Tensor:  # [R, k] int32, -1 where invalid (past topk_length too)
    if bool((indices < -1).any()) or bool((indices >= limit).any()):
        raise ValueError(f"{what} must be -1 (no entry) or in [0, {limit})")
    if topk_length is not None:
        k = indices.shape[1]
        if bool(((topk_length < 0) | (topk_length > k)).any()):
            raise ValueError(f"topk_length must lie in [0, k={k}]")
        past = torch.arange(k)[None, :] >= topk_length.reshape(-1, 1).long()
        indices = torch.where(past, -1, indices)
    return indices.to(torch.int32)


def _run(q_rows, stored, fmt, entries, softmax_scale, attn_sink):
    """q_rows [R, H, 576], stored [capacity, row_bytes] uint8 (jax), entries [R, k] int32."""
    rows, heads, _ = q_rows.shape
    k = entries.shape[1]
    dense = gather_rows(stored, to_jax(entries.flatten()), rows, k)
    sink = attn_sink is not None
    sink_values = attn_sink.float().reshape(1, heads) if sink else torch.zeros(1, heads)
    call = _attention_call(rows, heads, k, fmt, float(softmax_scale), sink, interpret_mode())
    valid = (entries >= 0).to(torch.int32)[:, None, :]
    out, lse = call(to_jax(q_rows), dense, to_jax(valid), to_jax(sink_values))
    return to_torch(out), to_torch(lse)[:, 0, :]


def decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8
    fmt: str,  # "fp8_ds_mla" or "bf16"
    slots: torch.Tensor,  # [B, s, k] int32, -1 = invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
    latent_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512] q.dtype, lse [B, s, H] float32
    if fmt not in LATENT_FORMATS:
        raise ValueError(f"latent format {fmt!r} has no Pallas kernel; supported: {LATENT_FORMATS}")
    if latent_scale is not None:
        raise ValueError(
            f"latent format {fmt!r} carries its scales in the row: pass latent_scale=None"
        )
    batch, next_n, heads, _ = q.shape
    num_blocks, block_size, row_bytes = cache.shape
    capacity = num_blocks * block_size
    lengths = None if topk_length is None else topk_length.reshape(-1)
    entries = _masked(slots.reshape(batch * next_n, -1), lengths, capacity, "slots")
    stored = to_jax(cache.reshape(capacity, row_bytes))
    out, lse = _run(
        q.reshape(batch * next_n, heads, LATENT_DIM), stored, fmt, entries, softmax_scale, attn_sink
    )
    return out.reshape(batch, next_n, heads, NOPE_DIM).to(q.dtype), lse.reshape(
        batch, next_n, heads
    )


def prefill(
    q: torch.Tensor,  # [T, H, 576] bfloat16
    kv: torch.Tensor,  # [S, 576] bfloat16 / float32 workspace
    indices: torch.Tensor,  # [T, k] int32, -1 = invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [T] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, H, 512] q.dtype, lse [T, H] float32
    if kv.dtype not in WORKSPACE_DTYPES:
        raise ValueError(f"kv must be bfloat16 or float32 here, got {kv.dtype}")
    entries = _masked(indices, topk_length, kv.shape[0], "indices")
    stored = to_jax(kv.contiguous().view(torch.uint8))
    out, lse = _run(q, stored, WORKSPACE_DTYPES[kv.dtype], entries, softmax_scale, attn_sink)
    return out.to(q.dtype), lse
