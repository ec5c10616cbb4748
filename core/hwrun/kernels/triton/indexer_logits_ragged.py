"""indexer.logits_ragged: score = sum_h w * relu(q . k) * k_scale over a ragged key array (the
prefill's keys), each query row against its window [ks, ke) of it, -inf outside.

Program (key tile, row group) reads one tile of keys and scores ROWS query rows against it:
over fp8 keys in one product of the rows' heads side by side (_ragged_fp8_rows), over mxfp4
keys one row at a time. Key tiles and query helpers are index_key_tiles.py's, the argument
checks indexer_logits.py's (the paged op).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.index_key_tiles import (
    FMT_MXFP4,
    fp8_key_scores,
    load_query_fp8_keys,
    load_query_group,
    mxfp4_key_scores,
    mxfp4_key_scores_folded,
    padded_heads,
    relu,
    weighted_relu_sum,
    wide_dtype,
)
from hwrun.kernels.triton.indexer_logits import KEY_FORMATS, check_query_args
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel


@triton.jit
def _ragged_logits_kernel(
    q_ptr,  # [M, H, 128]
    w_ptr,  # [M, H] float32
    elem_ptr,  # [N, element_bytes] uint8
    scale_ptr,  # [N, scale_bytes] uint8
    ks_ptr,  # [M] int32
    ke_ptr,  # [M] int32
    out_ptr,  # [M, N] float32
    M,
    N,
    elem_stride,
    scale_stride,
    H: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    FMT: tl.constexpr,
    Q_FP8: tl.constexpr,
    WIDE: tl.constexpr,
    FOLD: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n64 = n.to(tl.int64)
    n_mask = n < N
    elem_rows = elem_ptr + n64 * elem_stride
    scale_rows = scale_ptr + n64 * scale_stride
    head = tl.arange(0, HP)
    h_mask = head < H
    tile_lo = tl.program_id(0) * BLOCK_N
    if FMT == 0:
        _ragged_fp8_rows(
            q_ptr, w_ptr, elem_rows, scale_rows, ks_ptr, ke_ptr, out_ptr, M, N, n, n_mask,
            tile_lo, H, HP, BLOCK_N, ROWS, Q_FP8, WIDE,
        )  # fmt: skip
        return
    for i in range(ROWS):
        m = tl.program_id(1) * ROWS + i
        if m < M:
            start = tl.load(ks_ptr + m)
            end = tl.load(ke_ptr + m)
            inside = (n >= start) & (n < end)
            if (start < tile_lo + BLOCK_N) & (end > tile_lo):
                q_rows = m.to(tl.int64) * H + head
                w = tl.load(w_ptr + q_rows, mask=h_mask, other=0.0)
                if FMT == 0:
                    qt = load_query_fp8_keys(q_ptr, q_rows, h_mask, 128, Q_FP8, WIDE)
                    scores = fp8_key_scores(elem_rows, scale_rows, inside, qt, Q_FP8, WIDE)
                else:
                    q0 = load_query_group(q_ptr, q_rows, h_mask, 0, 128, Q_FP8, WIDE)
                    q1 = load_query_group(q_ptr, q_rows, h_mask, 1, 128, Q_FP8, WIDE)
                    q2 = load_query_group(q_ptr, q_rows, h_mask, 2, 128, Q_FP8, WIDE)
                    q3 = load_query_group(q_ptr, q_rows, h_mask, 3, 128, Q_FP8, WIDE)
                    if FOLD:
                        qt = load_query_fp8_keys(q_ptr, q_rows, h_mask, 128, Q_FP8, WIDE)
                        scores = mxfp4_key_scores_folded(
                            elem_rows, scale_rows, inside, qt, q0, q1, q2, q3, Q_FP8, WIDE
                        )
                    else:
                        scores = mxfp4_key_scores(
                            elem_rows, scale_rows, inside, q0, q1, q2, q3, Q_FP8, WIDE
                        )
                logits = tl.sum(relu(scores) * w[None, :], axis=1)
                logits = tl.where(inside, logits, float("-inf"))
            else:
                logits = tl.full((BLOCK_N,), float("-inf"), tl.float32)
            tl.store(out_ptr + m.to(tl.int64) * N + n64, logits, mask=n_mask)


@triton.jit
def _ragged_fp8_rows(
    q_ptr,
    w_ptr,
    elem_rows,  # [BLOCK_N] pointers to the tile's keys
    scale_rows,  # [BLOCK_N] pointers to their scales
    ks_ptr,
    ke_ptr,
    out_ptr,
    M,
    N,
    n,
    n_mask,
    tile_lo,
    H: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    Q_FP8: tl.constexpr,
    WIDE: tl.constexpr,
):
    """fp8 keys against the program's ROWS query rows in one product: the tile's keys and
    scales loaded once, the rows' heads side by side ([BLOCK_N, ROWS * HP], as the paged
    kernel's NEXT_N rows), each row's window applied after. A product per row reloaded the
    tile's keys and scales for every row and gave the matrix units ROWS narrow products
    instead of one. Columns outside a row's window but inside another's are computed for it
    and set to -inf; columns outside every row's are never read."""
    m = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    m_ok = m < M
    starts = tl.load(ks_ptr + m, mask=m_ok, other=0)
    ends = tl.load(ke_ptr + m, mask=m_ok, other=0)
    inside = (n[:, None] >= starts[None, :]) & (n[:, None] < ends[None, :]) & m_ok[None, :]
    logits = tl.full((BLOCK_N, ROWS), float("-inf"), tl.float32)
    read = tl.max(inside.to(tl.int32), 1) > 0  # a column some row's window holds
    if tl.max(read.to(tl.int32), 0) > 0:
        col = tl.arange(0, ROWS * HP)
        row_of, head = col // HP, col % HP
        q_rows = (tl.program_id(1) * ROWS + row_of).to(tl.int64) * H + head
        q_ok = (head < H) & ((tl.program_id(1) * ROWS + row_of) < M)
        w = tl.load(w_ptr + q_rows, mask=q_ok, other=0.0)
        qt = load_query_fp8_keys(q_ptr, q_rows, q_ok, 128, Q_FP8, WIDE)
        scores = fp8_key_scores(elem_rows, scale_rows, read & n_mask, qt, Q_FP8, WIDE)
        logits = tl.where(inside, weighted_relu_sum(scores, w, ROWS, HP), logits)
    out = out_ptr + m.to(tl.int64)[None, :] * N + n.to(tl.int64)[:, None]
    tl.store(out, logits, mask=n_mask[:, None] & m_ok[None, :])


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128] float8_e4m3fn or bf16/fp16/fp32
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, element_bytes] uint8
    key_scales: torch.Tensor,  # [N, scale_bytes] uint8
    fmt: str,  # "fp8" or "mxfp4"
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
    block_n: int = 64,
    rows: int = 4,
    num_warps: int = 4,
    fold_groups: bool = False,
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    """``fold_groups``: as for :func:`logits_paged`."""
    M = q.shape[0]
    H = check_query_args(q, weights, fmt, M, "logits_ragged")
    code, elem_bytes, scale_bytes = KEY_FORMATS[fmt]
    N = key_elements.shape[0]
    if key_elements.shape != (N, elem_bytes) or key_scales.shape != (N, scale_bytes):
        raise ValueError(
            f"logits_ragged: {fmt!r} keys must be elements uint8 [N, {elem_bytes}] and scales "
            f"uint8 [N, {scale_bytes}], got {tuple(key_elements.shape)} and "
            f"{tuple(key_scales.shape)}"
        )
    if key_elements.stride(1) != 1 or key_scales.stride(1) != 1:
        raise ValueError("logits_ragged: key rows must be contiguous (stride 1 within a row)")
    out = torch.empty((M, N), dtype=torch.float32, device=q.device)
    if M == 0 or N == 0:
        return out
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, rows))
    prepare_launch()
    _ragged_logits_kernel[grid](
        q.contiguous(),
        weights.contiguous().float(),
        key_elements,
        key_scales,
        ks.to(torch.int32).contiguous(),
        ke.to(torch.int32).contiguous(),
        out,
        M,
        N,
        key_elements.stride(0),
        key_scales.stride(0),
        H=H,
        HP=padded_heads(H),
        BLOCK_N=block_n,
        ROWS=rows,
        FMT=code,
        Q_FP8=q.dtype == torch.float8_e4m3fn,
        WIDE=wide_dtype(),
        FOLD=fold_groups and code == FMT_MXFP4,
        num_warps=num_warps,
        **pdl_options(q.device),
    )
    return out
