"""sparse_mla.decode and .prefill: absorbed MLA over top-k latent rows, one kernel.

Decode reads fp8_ds_mla or bf16 rows from the paged cache; prefill reads the gathered bf16 or
fp32 workspace, passed to the same kernel as a cache of one-row blocks (``ROW`` says how a row
is stored), with its top-k never split.

Program (row, head block, V part, split) gathers BLOCK_N latent rows at a time straight from
the paged cache and runs an online softmax in base 2. An fp8_ds_mla row is read as stored
(656 B): each of its four 128-wide NoPE groups is dequantized in registers as the format
decodes it (e4m3 times the bf16-rounded scale, rounded to bf16), so no dequantized row is ever
written to memory. The value is the NoPE part, so PV reuses the tiles QK loaded. With V_PARTS < 4 a
program owns only part of the 512 output columns (it recomputes the scores), which keeps the
accumulators within registers at 64+ heads; V_PARTS = 4 is the whole row, each tile loaded and
dequantized once for QK and PV (64 heads need 8 warps: 128 accumulator registers a thread).
With BF16_POSITION the e4m3 codes are decoded by moving their bits, not by the conversion
instructions (``_e4m3_times``). With SPLITS > 1 the top-k list is cut into independent parts
merged by lse_combine (decode at small batch has too few rows to fill the GPU otherwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.index_key_tiles import padded_heads, wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.lse_combine import combine_parts
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

LATENT_ROW_BYTES = {"bf16": 1152, "fp8_ds_mla": 656}
ROW_KINDS = {"fp8_ds_mla": 0, "bf16": 1}  # the kernel's ROW: how a key row is stored
WORKSPACE_ROW_KINDS = {torch.bfloat16: 1, torch.float32: 2}
_LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
BF16_BIAS_OVER_E4M3 = tl.constexpr(2.0**120)  # 2^(127 - 7): the exponent biases apart


@triton.jit
def _e4m3_times(raw, scale, BF16_POSITION: tl.constexpr):
    """e4m3 codes [N, C] uint8 times per-row scales [N] fp32, as the format decodes them
    (FlashMLA's): the scale rounded to bf16, each product rounded to bf16 (leaving the product in
    fp32 moved the LSE by up to 3e-3).

    With BF16_POSITION the codes are read without the conversion instructions: a code's sign,
    exponent and mantissa bits moved to their bf16 places (an fp32's top half) read as its value
    times 2^-120, the exponent biases (127 and 7) apart, subnormal codes as fp32 subnormals,
    which the multiply by 2^120 keeps (Triton's fp32 multiply does not flush them to zero).
    """
    if BF16_POSITION:
        bits = raw.to(tl.uint32)
        x = (((bits & 0x80) << 24) | ((bits & 0x7F) << 20)).to(tl.float32, bitcast=True)
        x = tl.where((bits & 0x7F) == 0x7F, float("nan"), x)  # NaN codes, else read as +-480
        # 2^120 in a multiply of its own: one factor scale * 2^120 overflows from scale 2^8 on.
        codes = x * BF16_BIAS_OVER_E4M3
    else:
        codes = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scale = scale.to(tl.bfloat16).to(tl.float32)
    return (codes * scale[:, None]).to(tl.bfloat16)


@triton.jit
def _nope_group(
    rows,
    valid,
    g: tl.constexpr,
    ROW: tl.constexpr,
    WIDE: tl.constexpr,
    BF16_POSITION: tl.constexpr,
):
    d = tl.arange(0, 128)
    if ROW == 0:  # fp8_ds_mla
        raw = tl.load(rows[:, None] + g * 128 + d[None, :], mask=valid[:, None], other=0)
        scale = tl.load((rows + 512 + 4 * g).to(tl.pointer_type(tl.float32)), mask=valid, other=0.0)
        tile = _e4m3_times(raw, scale, BF16_POSITION).to(WIDE)
    else:
        ptrs = _elements(rows, ROW) + 128 * g
        tile = tl.load(ptrs[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(WIDE)
    return tile


@triton.jit
def _elements(rows, ROW: tl.constexpr):
    """A bf16 (ROW 1) or fp32 (ROW 2) row's pointer as a pointer to its 576 elements."""
    if ROW == 1:
        ptrs = rows.to(tl.pointer_type(tl.bfloat16))
    else:
        ptrs = rows.to(tl.pointer_type(tl.float32))
    return ptrs


@triton.jit
def _rope(rows, valid, ROW: tl.constexpr, WIDE: tl.constexpr):
    d = tl.arange(0, 64)
    if ROW == 0:  # noqa: SIM108 (constexpr branches as statements, as Triton's jit reads them)
        ptrs = (rows + 528).to(tl.pointer_type(tl.bfloat16))
    else:
        ptrs = _elements(rows, ROW) + 512
    return tl.load(ptrs[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(WIDE)


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
    ROW: tl.constexpr,  # 0: fp8_ds_mla, 1: bf16 elements, 2: fp32 elements
    WIDE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    V_PARTS: tl.constexpr,
    BF16_POSITION: tl.constexpr,  # e4m3 decoded by moving bits (ROW 0 only)
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
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
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        slot = tl.load(slots_ptr + r * k + j, mask=j < hi, other=-1)
        valid = slot >= 0
        safe = tl.where(valid, slot, 0).to(tl.int64)
        offs = (safe // block_size) * cache_block_stride + (safe % block_size) * cache_row_stride
        rows = cache_ptr + tl.multiple_of(offs, 16)
        k0 = _nope_group(rows, valid, 0, ROW, WIDE, BF16_POSITION)
        k1 = _nope_group(rows, valid, 1, ROW, WIDE, BF16_POSITION)
        k2 = _nope_group(rows, valid, 2, ROW, WIDE, BF16_POSITION)
        k3 = _nope_group(rows, valid, 3, ROW, WIDE, BF16_POSITION)
        kr = _rope(rows, valid, ROW, WIDE)

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


def _attend(
    q: torch.Tensor,  # [R, H, 576]
    rows: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8, one key row per entry
    row_kind: int,  # ROW_KINDS value
    slots: torch.Tensor,  # [R, k] int, -1 invalid
    softmax_scale: float,
    lengths: torch.Tensor | None,  # [R] int
    attn_sink: torch.Tensor | None,  # [H] float32
    out_dtype: torch.dtype,
    block_h: int,
    block_n: int,
    v_parts: int,
    splits: int | None,
    num_warps: int,
    num_stages: int,
    bf16_position: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [R, H, 512] out_dtype, lse [R, H] fp32
    """Launch the kernel over the rows of ``q`` (and merge the top-k parts when split)."""
    R, H, _ = q.shape
    k = slots.shape[1]
    if rows.stride(2) != 1 or rows.stride(1) % 16 or rows.stride(0) % 16:
        raise ValueError("sparse_mla: key rows must be contiguous and 16-byte aligned")
    if R == 0:
        empty = torch.empty((0, H, 512), dtype=out_dtype, device=q.device)
        return empty, torch.empty((0, H), dtype=torch.float32, device=q.device)
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        programs = R * triton.cdiv(H, block_h) * (4 // v_parts)
        # At least 8 steps of block_n entries per part (batch 1 on the H200: 8 parts of 256
        # beat 64 parts of 32 by 2x: every part reloads the 128 x 576 queries).
        splits = max(1, min(triton.cdiv(k, 8 * block_n), sms // max(programs, 1)))
    chunk = triton.cdiv(triton.cdiv(k, splits), block_n) * block_n
    splits = triton.cdiv(k, chunk)
    direct = splits == 1  # one part: the kernel writes the final output, sink applied
    part_out = torch.empty(
        (splits, R, H, 512), dtype=out_dtype if direct else torch.float32, device=q.device
    )
    part_lse = torch.empty((splits, R, H), dtype=torch.float32, device=q.device)
    lens = lengths.to(torch.int32).contiguous() if lengths is not None else part_lse
    grid = (R, triton.cdiv(H, block_h) * (4 // v_parts), splits)
    prepare_launch()
    _sparse_mla_decode_kernel[grid](
        q.contiguous(),
        rows,
        slots.to(torch.int32).contiguous(),
        lens,
        attn_sink.float().contiguous() if attn_sink is not None else part_lse,
        part_out,
        part_lse,
        k,
        H,
        chunk,
        rows.shape[1],
        rows.stride(0),
        rows.stride(1),
        float(softmax_scale) * _LOG2E,
        HAS_LENS=lengths is not None,
        HAS_SINK=direct and attn_sink is not None,
        ROW=row_kind,
        WIDE=wide_dtype(),
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        V_PARTS=v_parts,
        BF16_POSITION=bf16_position,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_options(q.device),
    )
    if direct:
        return part_out[0], part_lse[0]
    return combine_parts(part_out, part_lse, attn_sink, out_dtype)


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
    bf16_position_dequant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512] q.dtype, lse [B, s, H] fp32
    """``sparse_mla.decode`` over the paged cache; the launch options are tuning knobs.

    ``v_parts`` (optional, default 2): how many 128-wide output groups a program owns; 4 is the
    whole row (each gathered tile dequantized once for QK and PV), with 64 heads at
    ``num_warps=8``. ``bf16_position_dequant`` (optional, default off): decode fp8_ds_mla codes
    by moving their bits (``_e4m3_times``), the same numbers. In one H200 run whole rows beat
    the default only with ``block_n=128`` and moving bits was slower everywhere (the times are
    noted at bench/gpu_ops.py's tune grid).
    """
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
    if slots.dim() != 3 or slots.shape[:2] != (B, S):
        raise ValueError(
            f"sparse_mla.decode: slots must be [B={B}, s={S}, k], got {tuple(slots.shape)}"
        )
    rows = B * S
    out, lse = _attend(
        q.reshape(rows, H, 576),
        cache,
        ROW_KINDS[fmt],
        slots.reshape(rows, -1),
        softmax_scale,
        None if topk_length is None else topk_length.reshape(rows),
        attn_sink,
        q.dtype,
        block_h,
        block_n,
        v_parts,
        splits,
        num_warps,
        num_stages,
        bf16_position_dequant,
    )
    return out.reshape(B, S, H, 512), lse.reshape(B, S, H)


def prefill(
    q: torch.Tensor,  # [T, H, 576] bfloat16
    kv: torch.Tensor,  # [S, 576] bfloat16 / float32, the gathered latent workspace
    indices: torch.Tensor,  # [T, k] int32 rows of kv, -1 = invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [T] int32, entries >= it are invalid
    attn_sink: torch.Tensor | None = None,  # [H] float32
    block_n: int = 32,
    num_warps: int = 8,
    num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, H, 512] q.dtype, lse [T, H] float32
    """``sparse_mla.prefill``: the decode kernel with the workspace as a cache of one-row blocks.

    Each token's row is one program per head block, its top-k never split, so a token's result
    does not depend on the batch. An fp32 workspace is read as fp32 and multiplied in the
    kernel's dtype (bf16 on a GPU: exact for workspaces decoded from the cache formats, whose
    values are bf16 values). Indices are not range-checked on the device (that would
    synchronise the host): every index must be -1 or lie in ``[0, S)``.
    """
    if q.dim() != 3 or q.shape[-1] != 576:
        raise ValueError(f"sparse_mla.prefill: q must be [T, H, 576], got {tuple(q.shape)}")
    if kv.dim() != 2 or kv.shape[1] != 576 or kv.dtype not in WORKSPACE_ROW_KINDS:
        raise ValueError(
            f"sparse_mla.prefill: kv must be bfloat16 or float32 [S, 576], got {kv.dtype} "
            f"{tuple(kv.shape)}"
        )
    tokens, heads, _ = q.shape
    if indices.dim() != 2 or indices.shape[0] != tokens or indices.shape[1] <= 0:
        raise ValueError(
            f"sparse_mla.prefill: indices must be [T={tokens}, k >= 1], got {tuple(indices.shape)}"
        )
    kv = kv.contiguous()
    rows = kv.view(torch.uint8).reshape(kv.shape[0], 1, 576 * kv.element_size())
    block_h = min(128, padded_heads(heads))
    return _attend(
        q,
        rows,
        WORKSPACE_ROW_KINDS[kv.dtype],
        indices,
        softmax_scale,
        topk_length,
        attn_sink,
        q.dtype,
        block_h,
        block_n,
        2 if block_h > 32 else 4,
        1,
        num_warps,
        num_stages,
        False,
    )
