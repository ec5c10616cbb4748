"""indexer.logits_paged: score = sum_h w * relu(q . k) * k_scale (indexer.logits_ragged, the same
score over a ragged key array, is indexer_logits_ragged.py's).

Paged: a step is STEP cache blocks of one request; scoring a step multiplies every query row
of the request (n * H rows of one matrix product) by the step's keys, read once from their
packed page. Steps past the request's longest row are only written as -inf. Two grids share
that step: the split grid, program (b, split) taking steps split, split + SPLITS, ... of
request b; and the persistent grid, a fixed number of programs each taking an equal share of
all requests' key steps laid end to end (then of the -inf steps), whatever the lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.descriptors import nvidia_sm90_or_later, use_torch_allocator
from hwrun.kernels.triton.index_key_tiles import (
    FMT_FP8,
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
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

KEY_FORMATS = {"fp8": (FMT_FP8, 128, 4), "mxfp4": (FMT_MXFP4, 64, 4)}  # code, elem B, scale B
HEAD_DIM = 128
INT32_MAX = 2**31 - 1


@triton.jit
def _key_descriptor(cache_ptr, key_rows, BLOCK_SIZE: tl.constexpr, TMA: tl.constexpr):
    """With TMA, the cache as rows of one fp8 key each ([key_rows, 128]): a page's keys are
    BLOCK_SIZE rows from its first byte, so one tile load reads them through the copy engine."""
    if TMA:
        desc = tl.make_tensor_descriptor(
            cache_ptr.to(tl.pointer_type(tl.float8e4nv)),
            shape=[key_rows, 128],
            strides=[128, 1],
            block_shape=[BLOCK_SIZE, 128],
        )
    else:
        desc = None
    return desc


@triton.jit
def _score_steps(
    b,
    first,
    last,
    every,
    q_ptr,  # [B, n, H, 128]
    w_ptr,  # [B * n, H] float32
    cache_ptr,  # [num_blocks, block_size * bytes_per_token] uint8
    key_desc,  # _key_descriptor's, None without TMA
    table_ptr,  # [B, max_blocks] int32
    lens_ptr,  # [B, n] int32
    out_ptr,  # [B * n, max_ctx] float32
    cache_block_stride,
    table_stride,
    out_stride,
    max_ctx,
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
    FOLD: tl.constexpr,
    TMA: tl.constexpr,
):
    """Request b's logits of steps first, first + every, ... < last (each holding keys)."""
    b = b.to(tl.int64)
    # Query rows i * HP + h; padded heads and rows have q = 0 and w = 0, so they add nothing.
    m = tl.arange(0, NP * HP)
    row_i = m // HP
    head = m % HP
    m_mask = (row_i < NEXT_N) & (head < H)
    q_rows = (b * NEXT_N + row_i) * H + head
    w = tl.load(w_ptr + q_rows, mask=m_mask, other=0.0)
    if FMT == 0 or FOLD:
        qt = load_query_fp8_keys(q_ptr, q_rows, m_mask, 128, Q_FP8, WIDE)
    if FMT != 0:
        q0 = load_query_group(q_ptr, q_rows, m_mask, 0, 128, Q_FP8, WIDE)
        q1 = load_query_group(q_ptr, q_rows, m_mask, 1, 128, Q_FP8, WIDE)
        q2 = load_query_group(q_ptr, q_rows, m_mask, 2, 128, Q_FP8, WIDE)
        q3 = load_query_group(q_ptr, q_rows, m_mask, 3, 128, Q_FP8, WIDE)

    rows = tl.arange(0, NP)
    row_ok = rows < NEXT_N
    lens = tl.load(lens_ptr + b * NEXT_N + rows, mask=row_ok, other=0)
    longest = tl.max(lens, 0)
    # Token t of a step sits in block t // BLOCK_SIZE of it.
    TOKENS: tl.constexpr = STEP * BLOCK_SIZE
    tok = tl.arange(0, TOKENS)
    in_block = tok % BLOCK_SIZE
    out_rows = out_ptr + (b * NEXT_N + rows) * out_stride
    key_blocks = tl.cdiv(longest, BLOCK_SIZE)
    if FMT == 0:  # fp8 keys' scales a step ahead, their block ids two (_step_blocks)
        table_row = table_ptr + b * table_stride
        scale = _key_scales(
            _step_blocks(table_row, first, last, tok, key_blocks, BLOCK_SIZE, STEP, TMA),
            cache_ptr, cache_block_stride, first, last, tok, in_block, longest,
            TOKENS, BLOCK_SIZE, ELEM_BYTES,
        )  # fmt: skip
        blk_ahead = _step_blocks(
            table_row, first + every, last, tok, key_blocks, BLOCK_SIZE, STEP, TMA
        )
    # No branch inside the loop, so loads are pipelined.
    for j in range(first, last, every):
        pos = j * TOKENS + tok
        n_mask = pos < longest
        if FMT == 0:
            blk_after = _step_blocks(
                table_row, j + 2 * every, last, tok, key_blocks, BLOCK_SIZE, STEP, TMA
            )
            scale_next = _key_scales(
                blk_ahead, cache_ptr, cache_block_stride, j + every, last, tok, in_block,
                longest, TOKENS, BLOCK_SIZE, ELEM_BYTES,
            )  # fmt: skip
        if TMA:
            # One block a step (STEP == 1), always allocated: j < key_blocks.
            blk = tl.load(table_ptr + b * table_stride + j).to(tl.int64)
            # Keys past the longest row are read as stored: their scores land in the rows'
            # -inf positions below, each product row depending on its own key only.
            keys = key_desc.load([(blk * cache_block_stride // 128).to(tl.int32), 0])
            if not Q_FP8:
                keys = keys.to(WIDE)
            scores = tl.dot(keys, qt) * scale[:, None]
        else:
            blk_idx = j * STEP + tok // BLOCK_SIZE
            blk = tl.load(
                table_ptr + b * table_stride + blk_idx, mask=blk_idx < key_blocks, other=0
            )
            page = cache_ptr + blk.to(tl.int64) * cache_block_stride
            elem_rows = page + in_block * ELEM_BYTES
            scale_rows = page + BLOCK_SIZE * ELEM_BYTES + in_block * 4
            if FMT == 0:
                scores = fp8_key_products(elem_rows, n_mask, qt, Q_FP8, WIDE) * scale[:, None]
            elif FOLD:
                scores = mxfp4_key_scores_folded(
                    elem_rows, scale_rows, n_mask, qt, q0, q1, q2, q3, Q_FP8, WIDE
                )
            else:
                scores = mxfp4_key_scores(
                    elem_rows, scale_rows, n_mask, q0, q1, q2, q3, Q_FP8, WIDE
                )
        logits = weighted_relu_sum(scores, w, NP, HP)
        logits = tl.where(pos[:, None] < lens[None, :], logits, float("-inf"))
        store_mask = (pos[:, None] < max_ctx) & row_ok[None, :]
        tl.store(out_rows[None, :] + pos[:, None], logits, mask=store_mask)
        if FMT == 0:
            scale, blk_ahead = scale_next, blk_after


@triton.jit
def _step_blocks(
    table_row,  # request b's block table
    j,
    last,
    tok,
    key_blocks,
    BLOCK_SIZE: tl.constexpr,
    STEP: tl.constexpr,
    TMA: tl.constexpr,
):
    """The block ids of step ``j``'s keys (a scalar with TMA: one block a step; else one per
    token), 0 for a step at or past ``last``. With :func:`_key_scales`, the fp8 keys' scales:
    _score_steps loads each step's scales a step ahead and their block ids two ahead, as no
    load of them waits on another in the step that issues it. Triton's pipeliner leaves a load
    that feeds no dot in the step that multiplies by it (as in linear.py's _step_scales), and
    each step waited on its block id and then on its scales."""
    if TMA:
        blk = tl.load(table_row + j, mask=(tl.zeros((), tl.int32) + j) < last, other=0)
    else:
        blk_idx = j * STEP + tok // BLOCK_SIZE
        live = (blk_idx < key_blocks) & ((tok * 0 + j) < last)
        blk = tl.load(table_row + blk_idx, mask=live, other=0)
    return blk


@triton.jit
def _key_scales(
    blk,  # _step_blocks' ids of step j
    cache_ptr,
    cache_block_stride,
    j,
    last,
    tok,
    in_block,
    longest,
    TOKENS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
):
    """The fp32 scales [TOKENS] of step ``j``'s fp8 keys (0 past the longest row, and for a
    step at or past ``last``)."""
    n_mask = ((j * TOKENS + tok) < longest) & ((tok * 0 + j) < last)
    page = cache_ptr + blk.to(tl.int64) * cache_block_stride
    scale_rows = page + BLOCK_SIZE * ELEM_BYTES + in_block * 4
    return tl.load(scale_rows.to(tl.pointer_type(tl.float32)), mask=n_mask, other=0.0)


@triton.jit
def _fill_steps(
    b, first, last, every, out_ptr, out_stride, max_ctx, NEXT_N: tl.constexpr, NP, TOKENS
):
    """-inf over request b's steps first, first + every, ... < last (past its longest row)."""
    rows = tl.arange(0, NP)
    tok = tl.arange(0, TOKENS)
    out_rows = out_ptr + (b.to(tl.int64) * NEXT_N + rows) * out_stride
    neg_inf = tl.full((TOKENS, NP), float("-inf"), tl.float32)
    for j in range(first, last, every):
        pos = j * TOKENS + tok
        store_mask = (pos[:, None] < max_ctx) & (rows < NEXT_N)[None, :]
        tl.store(out_rows[None, :] + pos[:, None], neg_inf, mask=store_mask)


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
    key_rows,
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
    TMA: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    """The split grid: program (b, split) takes steps split, split + SPLITS, ... of request b."""
    wait_for_previous_kernel(PDL)
    b = tl.program_id(0)
    split = tl.program_id(1)
    key_desc = _key_descriptor(cache_ptr, key_rows, BLOCK_SIZE, TMA)
    rows = tl.arange(0, NP)
    lens = tl.load(lens_ptr + b * NEXT_N + rows, mask=rows < NEXT_N, other=0)
    all_steps = tl.cdiv(num_ctx_blocks, STEP)
    key_steps = tl.minimum(tl.cdiv(tl.max(lens, 0), STEP * BLOCK_SIZE), all_steps)
    _score_steps(
        b, split, key_steps, SPLITS,
        q_ptr, w_ptr, cache_ptr, key_desc, table_ptr, lens_ptr, out_ptr,
        cache_block_stride, table_stride, out_stride, max_ctx,
        H, NEXT_N, NP, HP, BLOCK_SIZE, ELEM_BYTES, FMT, Q_FP8, WIDE, STEP, FOLD, TMA,
    )  # fmt: skip
    _fill_steps(
        b, key_steps + split, all_steps, SPLITS, out_ptr, out_stride, max_ctx,
        NEXT_N, NP, STEP * BLOCK_SIZE,
    )  # fmt: skip


@triton.jit
def _share(total, program, programs):
    """Program ``program``'s equal share [lo, hi) of ``total`` items (int64: total * programs
    passes int32 at long contexts)."""
    total = total.to(tl.int64)
    return program * total // programs, (program + 1) * total // programs


@triton.jit
def _segment(counts, lo, hi):
    """Items laid end to end, ``counts[r]`` of request r: the request b holding item lo and
    the items lo..hi of b as b's own [first, last)."""
    ends = tl.cumsum(counts, 0)
    before = ends <= lo  # requests wholly before item lo
    b = tl.sum(before.to(tl.int32), 0)
    start = tl.sum(tl.where(before, counts, 0), 0)
    count = tl.sum(tl.where(tl.arange(0, counts.shape[0]) == b, counts, 0), 0)
    return b, lo - start, tl.minimum(hi - start, count)


@triton.jit
def _persistent_paged_logits_kernel(
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
    key_rows,
    batch,
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
    FOLD: tl.constexpr,
    TMA: tl.constexpr,
    BP: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    """The persistent grid: every request's key steps laid end to end, each program scores an
    equal, contiguous share of them (so equal bytes of keys, whatever the lengths; a share
    crossing requests is one run of steps per request), then fills its share of the -inf steps
    the same way. Each program reads every request's lengths to find its share."""
    wait_for_previous_kernel(PDL)
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    key_desc = _key_descriptor(cache_ptr, key_rows, BLOCK_SIZE, TMA)
    reqs = tl.arange(0, BP)
    rows = tl.arange(0, NP)
    lens = tl.load(
        lens_ptr + reqs[:, None] * NEXT_N + rows[None, :],
        mask=(reqs[:, None] < batch) & (rows[None, :] < NEXT_N),
        other=0,
    )
    all_steps = tl.cdiv(num_ctx_blocks, STEP)
    key_steps = tl.minimum(tl.cdiv(tl.max(lens, 1), STEP * BLOCK_SIZE), all_steps)  # [BP]
    fill_steps = tl.where(reqs < batch, all_steps - key_steps, 0)

    lo, hi = _share(tl.sum(key_steps, 0), program, programs)
    while lo < hi:
        b, first, last = _segment(key_steps, lo, hi)
        _score_steps(
            b, first, last, 1,
            q_ptr, w_ptr, cache_ptr, key_desc, table_ptr, lens_ptr, out_ptr,
            cache_block_stride, table_stride, out_stride, max_ctx,
            H, NEXT_N, NP, HP, BLOCK_SIZE, ELEM_BYTES, FMT, Q_FP8, WIDE, STEP, FOLD, TMA,
        )  # fmt: skip
        lo += last - first
    lo, hi = _share(tl.sum(fill_steps, 0), program, programs)
    while lo < hi:
        b, first, last = _segment(fill_steps, lo, hi)
        b_key_steps = tl.sum(tl.where(reqs == b, key_steps, 0), 0)
        _fill_steps(
            b, b_key_steps + first, b_key_steps + last, 1, out_ptr, out_stride, max_ctx,
            NEXT_N, NP, STEP * BLOCK_SIZE,
        )  # fmt: skip
        lo += last - first


def check_query_args(q: torch.Tensor, weights: torch.Tensor, fmt: str, rows: int, op: str) -> int:
    """The checks both logits ops make of the key format, q [..., H, 128] and weights [rows, H];
    returns H."""
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


def _multiprocessors(device: torch.device) -> int:
    """The device's multiprocessors; 4 in the CPU interpreter, few enough that the tests' small
    shapes give each persistent program several steps."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _tma_reasons(fmt: str, step: int, cache: torch.Tensor, block_size: int) -> list[str]:
    """Why ``tma=True`` cannot read this cache (empty when it can)."""
    reasons = []
    if fmt != "fp8":
        reasons.append(f"it reads fp8 key pages, got {fmt!r} keys (use tma=False)")
    if step != 1:
        reasons.append(f"it loads one page a step (no gather on Hopper), got step={step}")
    if cache.stride(0) % HEAD_DIM or cache.data_ptr() % 16:
        reasons.append(
            f"it views the cache as rows of {HEAD_DIM} B from a 16-byte aligned start, so the "
            f"page stride must be a multiple of {HEAD_DIM} B, got stride {cache.stride(0)} at "
            f"address {cache.data_ptr():#x}"
        )
    elif (cache.shape[0] - 1) * cache.stride(0) // HEAD_DIM + block_size > INT32_MAX:
        reasons.append("the cache has more 128-byte rows than an int32 coordinate holds")
    return reasons


def paged_kernel_args(q, weights, cache, table, context_lens, out, max_ctx, num_ctx_blocks):
    """The leading arguments of every paged-logits kernel (this module's two grids and the NVIDIA
    plugin's Gluon kernel): the tensors as the kernels read them, their strides, the sizes."""
    return (
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
    )


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
    num_stages: int | None = None,
    step: int = 1,
    fold_groups: bool = False,
    persistent: bool = False,
    programs_per_sm: int = 4,
    tma: bool | None = None,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf past each row's length
    """Launch options (optional; the defaults are the H200 sweep's best, docs/benchmarks.md):

    ``num_stages`` (default 6 for fp8 keys on Hopper and later, else 4): pages in flight per
    program.
    ``tma`` (fp8 keys, ``step`` 1, a page stride that is a multiple of 128 B): each page's keys
    load as one tile through a tensor descriptor (Hopper's copy engine), scales as before; by
    default on an NVIDIA GPU of compute capability 9 or later wherever the cache allows it.
    ``fold_groups`` (mxfp4 keys): one K=128 product per key tile with the groups' powers of
    two folded into the e4m3 codes, where exact (index_key_tiles.mxfp4_key_scores_folded);
    off: slower than the four group products on the H200 (1012 against 619 us at B=64).
    ``persistent``: the persistent grid instead of the split one (``splits`` then unused):
    min(B * steps, multiprocessors * ``programs_per_sm``) programs, each scoring an equal share
    of all requests' key steps, so no wave of programs runs part-empty; off: slower than the
    split grid on the H200 at equal context lengths (ragged lengths, which it balances, are
    untimed).
    """
    B, n = q.shape[0], q.shape[1]
    H = check_query_args(q, weights, fmt, B * n, "logits_paged")
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
    if block_size & (block_size - 1):
        raise ValueError(f"logits_paged: block_size must be a power of two, got {block_size}")
    if persistent and splits is not None:
        raise ValueError(
            f"logits_paged: splits={splits} sets the split grid; persistent=True shares the "
            "steps out itself (leave splits unset)"
        )
    if persistent and programs_per_sm < 1:
        raise ValueError(f"logits_paged: programs_per_sm must be >= 1, got {programs_per_sm}")
    if tma is None:
        tma = nvidia_sm90_or_later(q.device) and not _tma_reasons(fmt, step, cache, block_size)
    elif tma and (reasons := _tma_reasons(fmt, step, cache, block_size)):
        raise ValueError("logits_paged: tma=True cannot run: " + "; ".join(reasons))
    if num_stages is None:
        num_stages = 6 if fmt == "fp8" and nvidia_sm90_or_later(q.device) else 4
    out = torch.empty((B * n, max_ctx), dtype=torch.float32, device=q.device)
    if B == 0 or max_ctx == 0:
        return out
    num_ctx_blocks = triton.cdiv(max_ctx, block_size)
    sms = _multiprocessors(q.device)
    table = block_table.to(torch.int32)
    args = (
        *paged_kernel_args(q, weights, cache, table, context_lens, out, max_ctx, num_ctx_blocks),
        (cache.shape[0] - 1) * cache.stride(0) // HEAD_DIM + block_size,  # key rows for tma
    )
    meta = {
        "H": H,
        "NEXT_N": n,
        "NP": triton.next_power_of_2(n),
        "HP": padded_heads(H),
        "BLOCK_SIZE": block_size,
        "ELEM_BYTES": elem_bytes,
        "FMT": code,
        "Q_FP8": q.dtype == torch.float8_e4m3fn,
        "WIDE": wide_dtype(),
        "STEP": step,
        "FOLD": fold_groups and code == FMT_MXFP4,
        "TMA": tma,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    prepare_launch()
    if tma and q.is_cuda:
        use_torch_allocator()
    if persistent:
        programs = min(B * triton.cdiv(num_ctx_blocks, step), sms * programs_per_sm)
        _persistent_paged_logits_kernel[(programs,)](
            *args, B, BP=triton.next_power_of_2(B), **meta, **pdl_options(q.device)
        )
        return out
    if splits is None:
        # ~8 programs per multiprocessor, 16 with tensor-descriptor pages (the best of grids on
        # the H200, bench/gpu_ops.py --tune: B=64 at 128K 343 -> 303 us with 16), each with at
        # least 4 blocks: shorter programs spend their time in the prologue (batch 1 ran 5x
        # slower with 1-2 blocks per program).
        per_sm = 16 if tma else 8
        splits = max(1, min(triton.cdiv(num_ctx_blocks, 4 * step), triton.cdiv(per_sm * sms, B)))
    _paged_logits_kernel[(B, splits)](*args, SPLITS=splits, **meta, **pdl_options(q.device))
    return out
