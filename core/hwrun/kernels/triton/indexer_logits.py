"""indexer.logits_paged and indexer.logits_ragged: score = sum_h w * relu(q . k) * k_scale.

Paged: program (b, split) walks the request's cache blocks split, split + SPLITS, ... and
scores every query row of the request (n * H rows of one matrix product) against each block's
keys, which are read once from their packed page. Blocks past the request's longest row are
only written as -inf. Ragged: program (key tile, row group) reads one tile of keys and scores
ROWS query rows against it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.index_key_tiles import (
    FMT_FP8,
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
from hwrun.kernels.triton.interpreter import prepare_launch

KEY_FORMATS = {"fp8": (FMT_FP8, 128, 4), "mxfp4": (FMT_MXFP4, 64, 4)}  # code, elem B, scale B
HEAD_DIM = 128


@triton.jit
def _paged_logits_kernel(
    q_ptr,  # [B, n, H, 128]
    w_ptr,  # [B * n, H] float32
    cache_ptr,  # [num_blocks, block_size * bytes_per_token] uint8
    table_ptr,  # [B, max_blocks] int32
    lens_ptr,  # [B, n] int32
    out_ptr,  # [B * n, max_ctx] float32
    cache_block_stride,
    table_stride,
    out_stride,
    max_ctx,
    num_ctx_blocks,
    H: tl.constexpr,
    NEXT_N: tl.constexpr,
    NP: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
    FMT: tl.constexpr,
    Q_FP8: tl.constexpr,
    WIDE: tl.constexpr,
    STEP: tl.constexpr,
    SPLITS,
    FOLD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    # Query rows i * HP + h; padded heads and rows have q = 0 and w = 0, so they add nothing.
    m = tl.arange(0, NP * HP)
    row_i = m // HP
    head = m % HP
    m_mask = (row_i < NEXT_N) & (head < H)
    q_rows = (b * NEXT_N + row_i) * H + head
    q_base = q_ptr
    w = tl.load(w_ptr + q_rows, mask=m_mask, other=0.0)
    if FMT == 0 or FOLD:
        qt = load_query_fp8_keys(q_base, q_rows, m_mask, 128, Q_FP8, WIDE)
    if FMT != 0:
        q0 = load_query_group(q_base, q_rows, m_mask, 0, 128, Q_FP8, WIDE)
        q1 = load_query_group(q_base, q_rows, m_mask, 1, 128, Q_FP8, WIDE)
        q2 = load_query_group(q_base, q_rows, m_mask, 2, 128, Q_FP8, WIDE)
        q3 = load_query_group(q_base, q_rows, m_mask, 3, 128, Q_FP8, WIDE)

    rows = tl.arange(0, NP)
    row_ok = rows < NEXT_N
    lens = tl.load(lens_ptr + b * NEXT_N + rows, mask=row_ok, other=0)
    longest = tl.max(lens, 0)
    # A step is STEP cache blocks: token t of the step sits in block t // BLOCK_SIZE of it.
    TOKENS: tl.constexpr = STEP * BLOCK_SIZE
    tok = tl.arange(0, TOKENS)
    in_block = tok % BLOCK_SIZE
    out_rows = out_ptr + (b * NEXT_N + rows) * out_stride
    key_blocks = tl.cdiv(longest, BLOCK_SIZE)
    key_steps = tl.cdiv(longest, TOKENS)
    # Steps holding keys of some row: no branch inside the loop, so loads are pipelined.
    for j in range(split, key_steps, SPLITS):
        pos = j * TOKENS + tok
        blk_idx = j * STEP + tok // BLOCK_SIZE
        blk = tl.load(table_ptr + b * table_stride + blk_idx, mask=blk_idx < key_blocks, other=0)
        page = cache_ptr + blk.to(tl.int64) * cache_block_stride
        n_mask = pos < longest
        elem_rows = page + in_block * ELEM_BYTES
        scale_rows = page + BLOCK_SIZE * ELEM_BYTES + in_block * 4
        if FMT == 0:
            scores = fp8_key_scores(elem_rows, scale_rows, n_mask, qt, Q_FP8, WIDE)
        elif FOLD:
            scores = mxfp4_key_scores_folded(
                elem_rows, scale_rows, n_mask, qt, q0, q1, q2, q3, Q_FP8, WIDE
            )
        else:
            scores = mxfp4_key_scores(elem_rows, scale_rows, n_mask, q0, q1, q2, q3, Q_FP8, WIDE)
        logits = weighted_relu_sum(scores, w, NP, HP)
        logits = tl.where(pos[:, None] < lens[None, :], logits, float("-inf"))
        store_mask = (pos[:, None] < max_ctx) & row_ok[None, :]
        tl.store(out_rows[None, :] + pos[:, None], logits, mask=store_mask)
    # The rest of the row (past the request's longest row) is only -inf.
    neg_inf = tl.full((TOKENS, NP), float("-inf"), tl.float32)
    for j in range(key_steps + split, tl.cdiv(num_ctx_blocks, STEP), SPLITS):
        pos = j * TOKENS + tok
        store_mask = (pos[:, None] < max_ctx) & row_ok[None, :]
        tl.store(out_rows[None, :] + pos[:, None], neg_inf, mask=store_mask)


def _check_common(q: torch.Tensor, weights: torch.Tensor, fmt: str, rows: int, op: str) -> int:
    if fmt not in KEY_FORMATS:
        raise ValueError(
            f"{op}: index-key format {fmt!r} has no Triton kernel; use one of {list(KEY_FORMATS)}"
        )
    if q.shape[-1] != HEAD_DIM:
        raise ValueError(f"{op}: q head dim must be {HEAD_DIM}, got {q.shape[-1]}")
    heads = q.shape[-2]
    if weights.shape != (rows, heads):
        raise ValueError(
            f"{op}: weights must be [{rows}, {heads}] float32, got {tuple(weights.shape)}"
        )
    return heads


def logits_paged(
    q: torch.Tensor,  # [B, n, H, 128] float8_e4m3fn or bf16/fp16/fp32
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8
    fmt: str,  # "fp8" or "mxfp4"
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
    splits: int | None = None,
    num_warps: int = 4,
    num_stages: int = 4,
    step: int = 1,
    fold_groups: bool = False,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf past each row's length
    """``fold_groups`` (mxfp4 keys): one K=128 product per key tile with the groups' powers of
    two folded into the e4m3 codes, where exact (index_key_tiles.mxfp4_key_scores_folded);
    not yet timed on a GPU, so off by default."""
    B, n = q.shape[0], q.shape[1]
    H = _check_common(q, weights, fmt, B * n, "logits_paged")
    code, elem_bytes, scale_bytes = KEY_FORMATS[fmt]
    bpt = elem_bytes + scale_bytes
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] % bpt:
        raise ValueError(
            f"logits_paged: cache must be uint8 [num_blocks, block_size * {bpt}] for {fmt!r}, got "
            f"{cache.dtype} {tuple(cache.shape)}"
        )
    if cache.stride(1) != 1:
        raise ValueError(
            "logits_paged: each cache page must be contiguous (stride 1 within a page)"
        )
    block_size = cache.shape[1] // bpt
    if context_lens.shape != (B, n):
        raise ValueError(
            f"logits_paged: context_lens must be [B, n]=[{B}, {n}], got {tuple(context_lens.shape)}"
        )
    out = torch.empty((B * n, max_ctx), dtype=torch.float32, device=q.device)
    if B == 0 or max_ctx == 0:
        return out
    num_ctx_blocks = triton.cdiv(max_ctx, block_size)
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        # ~8 programs per multiprocessor (the best of a grid on the H200, bench/gpu_ops.py
        # --tune), each with at least 4 blocks: shorter programs spend their time in the
        # prologue (batch 1 ran 5x slower with 1-2 blocks per program).
        splits = max(1, min(triton.cdiv(num_ctx_blocks, 4 * step), triton.cdiv(8 * sms, B)))
    if block_size & (block_size - 1):
        raise ValueError(f"logits_paged: block_size must be a power of two, got {block_size}")
    q_fp8 = q.dtype == torch.float8_e4m3fn
    table = block_table.to(torch.int32)
    prepare_launch()
    _paged_logits_kernel[(B, splits)](
        q.contiguous(),
        weights.contiguous().float(),
        cache,
        table,
        context_lens.to(torch.int32).contiguous(),
        out,
        cache.stride(0),
        table.stride(0),
        out.stride(0),
        max_ctx,
        num_ctx_blocks,
        H=H,
        NEXT_N=n,
        NP=triton.next_power_of_2(n),
        HP=padded_heads(H),
        BLOCK_SIZE=block_size,
        ELEM_BYTES=elem_bytes,
        FMT=code,
        Q_FP8=q_fp8,
        WIDE=wide_dtype(),
        STEP=step,
        SPLITS=splits,
        FOLD=fold_groups and code == FMT_MXFP4,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


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
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n64 = n.to(tl.int64)
    n_mask = n < N
    elem_rows = elem_ptr + n64 * elem_stride
    scale_rows = scale_ptr + n64 * scale_stride
    head = tl.arange(0, HP)
    h_mask = head < H
    tile_lo = tl.program_id(0) * BLOCK_N
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
    H = _check_common(q, weights, fmt, M, "logits_ragged")
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
    )
    return out
