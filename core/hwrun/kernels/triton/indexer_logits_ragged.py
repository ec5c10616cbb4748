"""indexer.logits_ragged: score = sum_h w * relu(q . k) * k_scale over a ragged key array (the
prefill's keys), each query row against its window [ks, ke) of it, -inf outside.

Program (key span, row group) scores ROWS query rows against a span of TILES key tiles of
BLOCK_N keys: the rows' heads side by side as one product's columns ([BLOCK_N, ROWS * HP], as
the paged kernel's next-n rows), their queries and weights loaded once for the whole span, the
key tiles streamed through it. Tiles of the span that no row's window reaches are only written
as -inf. Key tiles and query helpers are index_key_tiles.py's, the argument checks
indexer_logits.py's (the paged op).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.index_key_tiles import (
    FMT_MXFP4,
    fp8_key_products,
    load_query_fp8_keys,
    load_query_group,
    mxfp4_key_scores,
    mxfp4_key_scores_folded,
    padded_heads,
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
    tiles,  # key tiles a program's span holds
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
    m = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    m_ok = m < M
    starts = tl.load(ks_ptr + m, mask=m_ok, other=0)
    ends = tl.load(ke_ptr + m, mask=m_ok, other=0)
    holds = m_ok & (ends > starts)
    # The span's tiles [first, last) reach some row's window: the hull of the rows' windows.
    span = tl.program_id(0) * tiles
    span_end = tl.minimum(span + tiles, tl.cdiv(N, BLOCK_N))
    first = tl.maximum(span, tl.min(tl.where(holds, starts, N), 0) // BLOCK_N)
    hull_end = tl.cdiv(tl.max(tl.where(holds, ends, 0), 0), BLOCK_N)
    last = tl.maximum(first, tl.minimum(span_end, hull_end))
    out_rows = out_ptr + m.to(tl.int64) * N
    tok = tl.arange(0, BLOCK_N)
    store_rows = m_ok[None, :]
    empty = tl.full((BLOCK_N, ROWS), float("-inf"), tl.float32)
    for t in range(span, first):
        n = t * BLOCK_N + tok
        tl.store(out_rows[None, :] + n[:, None], empty, mask=(n < N)[:, None] & store_rows)
    for t in range(last, span_end):
        n = t * BLOCK_N + tok
        tl.store(out_rows[None, :] + n[:, None], empty, mask=(n < N)[:, None] & store_rows)
    if last > first:
        _score_tiles(
            q_ptr, w_ptr, elem_ptr, scale_ptr, out_rows, M, N, elem_stride, scale_stride,
            starts, ends, m_ok, first, last, H, HP, BLOCK_N, ROWS, FMT, Q_FP8, WIDE, FOLD,
        )  # fmt: skip


@triton.jit
def _score_tiles(
    q_ptr,
    w_ptr,
    elem_ptr,
    scale_ptr,
    out_rows,  # [ROWS] pointers to the rows' logits
    M,
    N,
    elem_stride,
    scale_stride,
    starts,  # [ROWS] the rows' windows, [0, 0) for rows past M
    ends,
    m_ok,
    first,
    last,
    H: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    FMT: tl.constexpr,
    Q_FP8: tl.constexpr,
    WIDE: tl.constexpr,
    FOLD: tl.constexpr,
):
    """Key tiles first..last-1 against the program's rows, their queries and weights loaded once
    (a program per tile reloaded 32 KB of queries for every 8 KB tile of fp8 keys). Columns
    outside a row's window are computed for it and set to -inf (by selection: a NaN key must
    not reach a row that does not read it), keys inside the tiles but in no row's window
    included; keys outside those tiles (the hull of the rows' windows) are never read."""
    col = tl.arange(0, ROWS * HP)
    row_of, head = col // HP, col % HP
    row = tl.program_id(1) * ROWS + row_of
    q_rows = row.to(tl.int64) * H + head
    q_ok = (head < H) & (row < M)
    w = tl.load(w_ptr + q_rows, mask=q_ok, other=0.0)
    if FMT == 0 or FOLD:
        qt = load_query_fp8_keys(q_ptr, q_rows, q_ok, 128, Q_FP8, WIDE)
    if FMT != 0:
        q0 = load_query_group(q_ptr, q_rows, q_ok, 0, 128, Q_FP8, WIDE)
        q1 = load_query_group(q_ptr, q_rows, q_ok, 1, 128, Q_FP8, WIDE)
        q2 = load_query_group(q_ptr, q_rows, q_ok, 2, 128, Q_FP8, WIDE)
        q3 = load_query_group(q_ptr, q_rows, q_ok, 3, 128, Q_FP8, WIDE)
    tok = tl.arange(0, BLOCK_N)
    if FMT == 0:
        scale = _fp8_tile_scales(scale_ptr, scale_stride, first, last, N, tok, BLOCK_N)
    # No branch inside the loop, so its key loads are pipelined.
    for t in range(first, last):
        n = t * BLOCK_N + tok
        inside = (n[:, None] >= starts[None, :]) & (n[:, None] < ends[None, :])
        key_ok = n < N
        elem_rows = elem_ptr + n.to(tl.int64) * elem_stride
        if FMT == 0:
            scale_next = _fp8_tile_scales(scale_ptr, scale_stride, t + 1, last, N, tok, BLOCK_N)
            products = fp8_key_products(elem_rows, key_ok, qt, Q_FP8, WIDE)
            # The key's scale after the head sum (a positive scale commutes with relu): one
            # multiply a key and row instead of one a product (128 FMUL a tile a thread).
            logits = weighted_relu_sum(products, w, ROWS, HP) * scale[:, None]
        else:
            scale_rows = scale_ptr + n.to(tl.int64) * scale_stride
            if FOLD:
                scores = mxfp4_key_scores_folded(
                    elem_rows, scale_rows, key_ok, qt, q0, q1, q2, q3, Q_FP8, WIDE
                )
            else:
                scores = mxfp4_key_scores(
                    elem_rows, scale_rows, key_ok, q0, q1, q2, q3, Q_FP8, WIDE
                )
            logits = weighted_relu_sum(scores, w, ROWS, HP)
        logits = tl.where(inside, logits, float("-inf"))
        tl.store(out_rows[None, :] + n[:, None], logits, mask=(n < N)[:, None] & m_ok[None, :])
        if FMT == 0:
            scale = scale_next


@triton.jit
def _fp8_tile_scales(scale_ptr, scale_stride, t, last, N, tok, BLOCK_N: tl.constexpr):
    """Tile t's fp32 key scales (0 past ``last``), loaded a tile before its product: Triton's
    pipeliner leaves a load that feeds no dot in the step that multiplies by it (as the paged
    kernel's _step_blocks says). Scales of keys no row reads are loaded too: their products are
    discarded by selection, so even a NaN scale there never reaches a logit."""
    n = t * BLOCK_N + tok
    live = (n < N) & ((tok * 0 + t) < last)
    scale_rows = (scale_ptr + n.to(tl.int64) * scale_stride).to(tl.pointer_type(tl.float32))
    return tl.load(scale_rows, mask=live, other=0.0)


def default_rows(heads: int, fmt: str) -> int:
    """Query rows a program scores side by side. fp8: up to 4, as many as keep the product 256
    columns wide (a [64, 512] fp32 accumulator at 4 warps would not fit in registers). mxfp4:
    1, as before rows were side by side: at 4 warps its sm_90 cubin spills from 2 rows on
    (255 registers and 1856 bytes of stack at 4), and 4 rows at 8 warps, which fit, are
    untimed."""
    return max(1, min(4, 256 // padded_heads(heads))) if fmt == "fp8" else 1


MAX_SPAN_TILES = 32


def default_tiles(key_tiles: int, row_groups: int, multiprocessors: int) -> int:
    """Key tiles a program's span holds: up to MAX_SPAN_TILES (fp8 keys, M=4096 N=16384 H=64 on
    an H100: 2765 us a tile a program, 1370 at 8, 1239 at 32), fewer where longer spans would
    leave under four programs a multiprocessor (a short prefill against a long key array)."""
    return max(1, min(MAX_SPAN_TILES, key_tiles * row_groups // (4 * multiprocessors)))


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128] float8_e4m3fn or bf16/fp16/fp32
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, element_bytes] uint8
    key_scales: torch.Tensor,  # [N, scale_bytes] uint8
    fmt: str,  # "fp8" or "mxfp4"
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
    block_n: int = 64,
    rows: int | None = None,
    tiles: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    fold_groups: bool = False,
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    """``rows``: query rows per program (default :func:`default_rows`); ``tiles``: key tiles of
    ``block_n`` keys per program, the rows' queries loaded once for all of them (default
    :func:`default_tiles`);
    ``fold_groups``: as for :func:`logits_paged`."""
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
    rows = default_rows(H, fmt) if rows is None else rows
    if rows < 1 or rows & (rows - 1) or (tiles is not None and tiles < 1):
        raise ValueError(
            f"logits_ragged: rows must be a power of two and tiles at least 1, got rows={rows} "
            f"tiles={tiles}"
        )
    if tiles is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        tiles = default_tiles(triton.cdiv(N, block_n), triton.cdiv(M, rows), sms)
    out = torch.empty((M, N), dtype=torch.float32, device=q.device)
    if M == 0 or N == 0:
        return out
    grid = (triton.cdiv(triton.cdiv(N, block_n), tiles), triton.cdiv(M, rows))
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
        tiles,
        H=H,
        HP=padded_heads(H),
        BLOCK_N=block_n,
        ROWS=rows,
        FMT=code,
        Q_FP8=q.dtype == torch.float8_e4m3fn,
        WIDE=wide_dtype(),
        FOLD=fold_groups and code == FMT_MXFP4,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_options(q.device),
    )
    return out
