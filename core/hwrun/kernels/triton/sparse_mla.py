"""sparse_mla.decode: absorbed MLA over top-k latent cache slots, fp8_ds_mla and bf16 rows.

Program (row, head block, V part, split) gathers BLOCK_N latent rows at a time straight from
the paged cache and runs an online softmax in base 2. An fp8_ds_mla row is read as stored
(656 B): each of its four 128-wide NoPE groups is dequantized in registers as the format
decodes it (e4m3 times the bf16-rounded scale, rounded to bf16), so no dequantized row is ever
written to memory. The value is the NoPE part, so PV reuses the tiles QK loaded. With V_PARTS < 4 a
program owns only part of the 512 output columns (it recomputes the scores), which keeps the
accumulators within registers at 64+ heads. With SPLITS > 1 the top-k list is cut into
independent parts merged by lse_combine (decode at small batch has too few rows to fill the
GPU otherwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.index_key_tiles import wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.lse_combine import combine_parts

LATENT_ROW_BYTES = {"bf16": 1152, "fp8_ds_mla": 656}
_LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _nope_group(rows, valid, g: tl.constexpr, FP8: tl.constexpr, WIDE: tl.constexpr):
    d = tl.arange(0, 128)
    if FP8:
        raw = tl.load(rows[:, None] + g * 128 + d[None, :], mask=valid[:, None], other=0)
        codes = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        scale = tl.load((rows + 512 + 4 * g).to(tl.pointer_type(tl.float32)), mask=valid, other=0.0)
        # The format's decode (FlashMLA's): the scale rounded to bf16, then the product rounded
        # to bf16 (leaving the product in fp32 moved the LSE by up to 3e-3).
        scale = scale.to(tl.bfloat16).to(tl.float32)
        tile = (codes * scale[:, None]).to(tl.bfloat16).to(WIDE)
    else:
        ptrs = (rows + 256 * g).to(tl.pointer_type(tl.bfloat16))
        tile = tl.load(ptrs[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(WIDE)
    return tile


@triton.jit
def _load_q(q_row, heads, h_mask, start: tl.constexpr, width: tl.constexpr, WIDE: tl.constexpr):
    d = start + tl.arange(0, width)
    return tl.load(q_row + heads[:, None] * 576 + d[None, :], mask=h_mask[:, None], other=0.0).to(
        WIDE
    )


@triton.jit
def _sparse_mla_decode_kernel(
    q_ptr,  # [R, H, 576]
    cache_ptr,  # uint8, block stride and row stride below
    slots_ptr,  # [R, k] int32
    lens_ptr,  # [R] int32 (unused without HAS_LENS)
    sink_ptr,  # [H] float32 (unused without HAS_SINK)
    part_out_ptr,  # [SPLITS, R, H, 512] float32, or the final [R, H, 512] output
    part_lse_ptr,  # [SPLITS, R, H] float32, natural log
    k,
    H,
    chunk,  # entries per split
    block_size,
    cache_block_stride,
    cache_row_stride,
    scale_log2,  # softmax_scale * log2(e)
    HAS_LENS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    FP8: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    V_PARTS: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    split = tl.program_id(2)
    n_v = 4 // V_PARTS
    h_block = hv // n_v
    v0 = (hv % n_v) * V_PARTS  # first 128-wide output group of this program
    R = tl.num_programs(0)

    heads = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    q_row = q_ptr + r * H * 576
    q0 = _load_q(q_row, heads, h_mask, 0, 128, WIDE)
    q1 = _load_q(q_row, heads, h_mask, 128, 128, WIDE)
    q2 = _load_q(q_row, heads, h_mask, 256, 128, WIDE)
    q3 = _load_q(q_row, heads, h_mask, 384, 128, WIDE)
    qr = _load_q(q_row, heads, h_mask, 512, 64, WIDE)

    limit = k
    if HAS_LENS:
        limit = tl.minimum(tl.load(lens_ptr + r), k)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, limit)

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc0 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc1 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc2 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc3 = tl.zeros((BLOCK_H, 128), tl.float32)
    d_rope = tl.arange(0, 64)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        slot = tl.load(slots_ptr + r * k + j, mask=j < hi, other=-1)
        valid = slot >= 0
        safe = tl.where(valid, slot, 0).to(tl.int64)
        offs = (safe // block_size) * cache_block_stride + (safe % block_size) * cache_row_stride
        rows = cache_ptr + tl.multiple_of(offs, 16)
        k0 = _nope_group(rows, valid, 0, FP8, WIDE)
        k1 = _nope_group(rows, valid, 1, FP8, WIDE)
        k2 = _nope_group(rows, valid, 2, FP8, WIDE)
        k3 = _nope_group(rows, valid, 3, FP8, WIDE)
        rope_ptrs = (rows + (528 if FP8 else 1024)).to(tl.pointer_type(tl.bfloat16))
        kr = tl.load(rope_ptrs[:, None] + d_rope[None, :], mask=valid[:, None], other=0.0).to(WIDE)

        s = tl.dot(q0, tl.trans(k0))
        s += tl.dot(q1, tl.trans(k1))
        s += tl.dot(q2, tl.trans(k2))
        s += tl.dot(q3, tl.trans(k3))
        s += tl.dot(qr, tl.trans(kr))
        s = tl.where(valid[None, :], s * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        pw = p.to(WIDE)
        if V_PARTS == 4:
            acc0 = acc0 * alpha[:, None] + tl.dot(pw, k0)
            acc1 = acc1 * alpha[:, None] + tl.dot(pw, k1)
            acc2 = acc2 * alpha[:, None] + tl.dot(pw, k2)
            acc3 = acc3 * alpha[:, None] + tl.dot(pw, k3)
        elif v0 == 0:
            acc0 = acc0 * alpha[:, None] + tl.dot(pw, k0)
            acc1 = acc1 * alpha[:, None] + tl.dot(pw, k1)
        else:
            acc0 = acc0 * alpha[:, None] + tl.dot(pw, k2)
            acc1 = acc1 * alpha[:, None] + tl.dot(pw, k3)

    empty = l_i == 0.0
    inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    if HAS_SINK:
        # Only when the kernel writes the final output (one split); else lse_combine does it.
        sink = tl.load(sink_ptr + heads, mask=h_mask, other=0.0)
        inv = inv * tl.where(empty, 0.0, 1.0 / (1.0 + tl.exp(sink - tl.where(empty, 0.0, lse))))
    part = split * R + r
    tl.store(part_lse_ptr + part * H + heads, lse, mask=h_mask)
    out_rows = part_out_ptr + (part * H + heads)[:, None] * 512
    d = tl.arange(0, 128)
    tl.store(out_rows + v0 * 128 + d[None, :], acc0 * inv[:, None], mask=h_mask[:, None])
    tl.store(out_rows + (v0 + 1) * 128 + d[None, :], acc1 * inv[:, None], mask=h_mask[:, None])
    if V_PARTS == 4:
        tl.store(out_rows + 256 + d[None, :], acc2 * inv[:, None], mask=h_mask[:, None])
        tl.store(out_rows + 384 + d[None, :], acc3 * inv[:, None], mask=h_mask[:, None])


def decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8
    fmt: str,  # "fp8_ds_mla" or "bf16"
    slots: torch.Tensor,  # [B, s, k] int32, -1 invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
    latent_scale: float | None = None,
    block_h: int = 128,
    block_n: int = 32,
    v_parts: int = 2,
    splits: int | None = None,
    num_warps: int = 8,
    num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512] q.dtype, lse [B, s, H] fp32
    if fmt not in LATENT_ROW_BYTES:
        raise ValueError(
            f"sparse_mla.decode (triton): latent format {fmt!r} has no kernel; use one of "
            f"{list(LATENT_ROW_BYTES)}"
        )
    if latent_scale is not None:
        raise ValueError("sparse_mla.decode (triton): latent_scale applies to fp8_e4m3 only")
    if q.dim() != 4 or q.shape[-1] != 576:
        raise ValueError(f"sparse_mla.decode: q must be [B, s, H, 576], got {tuple(q.shape)}")
    B, S, H, _ = q.shape
    row_bytes = LATENT_ROW_BYTES[fmt]
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != row_bytes:
        raise ValueError(
            f"sparse_mla.decode: cache must be uint8 [num_blocks, block_size, {row_bytes}] for "
            f"{fmt!r}, got {cache.dtype} {tuple(cache.shape)}"
        )
    if cache.stride(2) != 1 or cache.stride(1) % 16 or cache.stride(0) % 16:
        raise ValueError("sparse_mla.decode: cache rows must be contiguous and 16-byte aligned")
    if slots.dim() != 3 or slots.shape[:2] != (B, S):
        raise ValueError(
            f"sparse_mla.decode: slots must be [B={B}, s={S}, k], got {tuple(slots.shape)}"
        )
    rows, k = B * S, slots.shape[2]
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        programs = rows * triton.cdiv(H, block_h) * (4 // v_parts)
        # At least 8 steps of block_n entries per part (batch 1 on the H200: 8 parts of 256
        # beat 64 parts of 32 by 2x: every part reloads the 128 x 576 queries).
        splits = max(1, min(triton.cdiv(k, 8 * block_n), sms // max(programs, 1)))
    chunk = triton.cdiv(triton.cdiv(k, splits), block_n) * block_n
    splits = triton.cdiv(k, chunk)
    direct = splits == 1  # one part: the kernel writes the final output, sink applied
    out_dtype = q.dtype if direct else torch.float32
    part_out = torch.empty((splits, rows, H, 512), dtype=out_dtype, device=q.device)
    part_lse = torch.empty((splits, rows, H), dtype=torch.float32, device=q.device)
    lens = topk_length.reshape(rows).to(torch.int32) if topk_length is not None else slots
    grid = (rows, triton.cdiv(H, block_h) * (4 // v_parts), splits)
    prepare_launch()
    _sparse_mla_decode_kernel[grid](
        q.reshape(rows, H, 576).contiguous(),
        cache,
        slots.reshape(rows, k).to(torch.int32).contiguous(),
        lens,
        attn_sink.float().contiguous() if attn_sink is not None else part_lse,
        part_out,
        part_lse,
        k,
        H,
        chunk,
        cache.shape[1],
        cache.stride(0),
        cache.stride(1),
        float(softmax_scale) * _LOG2E,
        HAS_LENS=topk_length is not None,
        HAS_SINK=direct and attn_sink is not None,
        FP8=fmt == "fp8_ds_mla",
        WIDE=wide_dtype(),
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        V_PARTS=v_parts,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if direct:
        return part_out.reshape(B, S, H, 512), part_lse.reshape(B, S, H)
    out, lse = combine_parts(part_out, part_lse, attn_sink, q.dtype)
    return out.reshape(B, S, H, 512), lse.reshape(B, S, H)
