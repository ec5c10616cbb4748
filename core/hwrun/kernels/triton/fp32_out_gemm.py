"""``x @ weight.T`` of bf16 operands with fp32 sums and an fp32 output, in one launch: the
engine's small fp32 products (the MoE router, the indexer's head weights; engine/linears.py's
``Fp32Linear``) at decode row counts.

A product of two bf16 values is exact in fp32, so the result is the fp32 product's up to
summation order. cuBLAS ran these (``torch.mm(x, w.t(), torch.float32)``) at 64 rows on the
H200 as a split-K kernel plus a second launch that adds the splits (4.5 + 1.6 us, 31 pairs a
decode step). Here the K dimension is split too, but the splits are added inside the launch:

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLITS)``; each program multiplies its tile over
one run of K steps (``tl.dot`` on bf16 tiles, fp32 accumulator). With ``SPLITS > 1`` each
program stores its partial tile to a workspace and counts itself on the tile's counter (an
acquire-release atomic at GPU scope); the one that counts last adds every partial in split
order (the same bits whichever finished last), writes the output and sets the counter back to
zero (split_counters.py: one zeroed buffer per device, left zeroed by every launch).

Nothing reads a device value on the host and every allocation follows from the shapes, so a
CUDA graph may capture it. The tiles and the split depend on M, so a row's bits do too (as
with cuBLAS): not batch-invariant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from hwrun import knobs
from hwrun.kernels.triton.index_key_tiles import wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import (
    pdl_options,
    prefetch_lines,
    prefetch_to_l2,
    wait_for_previous_kernel,
)
from hwrun.kernels.triton.split_counters import zeroed_counters

MIN_BLOCK = 16  # the matrix units' smallest tile side
MAX_BLOCK_M = 64  # taller inputs tile over the grid's first dimension
MAX_SPLITS = 16  # more K runs than this were slower on the H200 (default_tiles)


@dataclass(frozen=True)
class Fp32OutTiles:
    """Launch shape of ``_fp32_out_mm_kernel``: block sizes are powers of two of at least 16;
    ``splits`` runs of whole K steps (fewer when the K steps do not fill that many)."""

    block_m: int
    block_n: int
    block_k: int
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_tiles(m: int, n: int, k: int) -> Fp32OutTiles:
    """Row blocks as tall as the rows (16-64), 16 output columns, 128-wide K steps, and the
    split of :func:`balanced_splits`, at most ``MAX_SPLITS``. The best of
    ``bench/fp32_out_gemm_gpu.py --tune`` on the H200 (2026-12-03, us; cuBLAS's ``torch.mm``
    with its split-K sum: 5.7-6.6): [64, 4096] at 1, 8 and 64 rows 16 columns split 16, 16 and
    8 (3.15, 3.24, 4.03), against 3.6, 3.5 and 4.7 with 32 columns; DeepSeek-V3's router
    [256, 7168] 32 columns split 16 at 1 and 8 rows (4.16, 4.21), 16 split 8 at 64 (5.06)."""
    block_m = min(MAX_BLOCK_M, max(MIN_BLOCK, triton.next_power_of_2(max(m, 1))))
    tiles = Fp32OutTiles(block_m=block_m, block_n=16, block_k=128)
    return replace(tiles, splits=min(MAX_SPLITS, balanced_splits(tiles, m, k)))


def balanced_splits(tiles: Fp32OutTiles, m: int, k: int) -> int:
    """K runs that shorten the longest chain of one tile: its last program reads its own run
    of x and weight, ``2 (rows + BLOCK_N) K / S`` bytes, then all ``S`` fp32 partials,
    ``4 S rows BLOCK_N`` bytes (rows: the tile's rows that exist). The two balance at
    ``S = sqrt((rows + BLOCK_N) K / (2 rows BLOCK_N))``; this takes the power of two at or below
    it, and no more runs than K steps. At K = 4096 and 32 output columns: 32 runs for 1 row, 16
    for 8 rows, 8 for 64 (DeepSeek-V3's router, K = 7168: 32, 16 and 8, before the launch
    evens them out to 28, 14 and 8 runs of 2, 4 and 7 steps)."""
    rows = max(1, min(m, tiles.block_m))
    balance = math.sqrt((rows + tiles.block_n) * k / (2 * rows * tiles.block_n))
    splits = 1 << max(0, int(balance).bit_length() - 1)
    return max(1, min(splits, triton.cdiv(k, tiles.block_k)))


@triton.jit
def _fp32_out_mm_kernel(
    x_ptr,  # [M, K] bf16, row stride stride_xm
    w_ptr,  # [N, K] bf16, row stride stride_wn
    out_ptr,  # [M, N] float32, contiguous
    part_ptr,  # [SPLITS, M, N] float32: each K run's partial sums (SPLITS > 1)
    count_ptr,  # [cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)] int32 zeros, left at zero
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_split,  # M * N: between the partials of two runs
    k_run,  # K columns per run, a multiple of BLOCK_K
    MMA: tl.constexpr,  # the tiles' dtype on the matrix units: bf16 (fp32 in the interpreter)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLITS: tl.constexpr,
    PREFETCH_LINES: tl.constexpr = 0,  # with PDL: 128-byte lines of each weight row put in L2
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    k_begin = split * k_run
    k_end = tl.minimum(K, k_begin + k_run)
    if PREFETCH_LINES > 0:
        # The start of this program's run of its weight rows (up to 2 KB a row; no kernel
        # writes weights), fetched while the kernel ahead finishes.
        col = k_begin + tl.arange(0, PREFETCH_LINES) * 64  # bf16: 64 a 128-byte line
        prefetch_to_l2(w_rows + col[None, :], n_mask[:, None] & (col < k_end)[None, :], PDL)
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_mask = kk < K
        a = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(a.to(MMA), tl.trans(w.to(MMA)), acc)
    out_mask = m_mask[:, None] & n_mask[None, :]
    tile_offsets = m.to(tl.int64)[:, None] * N + n[None, :]
    if SPLITS > 1:
        part = part_ptr + tile_offsets
        tl.store(part + split.to(tl.int64) * stride_split, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's sums stored before the count says so
        tile = pid_m * tl.num_programs(1) + pid_n
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") < SPLITS - 1:
            return
        tl.store(count_ptr + tile, 0)  # for the next launch (split_counters.py)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for _ in tl.static_range(SPLITS):  # in split order: the same bits whoever is last
            acc += tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")
            part += stride_split
    tl.store(out_ptr + tile_offsets, acc, mask=out_mask)


def _problems(x: torch.Tensor, weight: torch.Tensor, tiles: Fp32OutTiles | None) -> list[str]:
    problems = []
    for name, tensor, dims in (("x", x, "[M, K]"), ("weight", weight, "[N, K]")):
        if tensor.dim() != 2 or tensor.dtype != torch.bfloat16:
            problems.append(
                f"{name} must be a 2-D bfloat16 tensor {dims}, got {tensor.dtype} of shape "
                f"{list(tensor.shape)}"
            )
    if x.dim() == 2 and weight.dim() == 2 and x.shape[1] != weight.shape[1]:
        problems.append(
            f"x's K ({x.shape[1]}) must equal weight's ({weight.shape[1]}): x [M, K], weight "
            f"[N, K], got {list(x.shape)} and {list(weight.shape)}"
        )
    if weight.dim() == 2 and weight.shape[1] > 1 and weight.stride(1) != 1:
        problems.append(
            f"weight must be row-major with K contiguous (stride 1), got strides "
            f"{list(weight.stride())}; pass weight.contiguous() once, not per call"
        )
    if x.device != weight.device:
        problems.append(f"x and weight must be on one device, got {x.device} and {weight.device}")
    elif x.device.type == "cpu" and not knobs.triton_interpret():
        problems.append(
            "the tensors are on 'cpu': the kernel needs a GPU, or Triton's CPU interpreter "
            "(TRITON_INTERPRET=1 before the kernels are imported)"
        )
    if tiles is not None:
        sizes = {"block_m": tiles.block_m, "block_n": tiles.block_n, "block_k": tiles.block_k}
        for name, size in sizes.items():
            if size < MIN_BLOCK or size & (size - 1):
                problems.append(f"tiles.{name} must be a power of two >= {MIN_BLOCK}, got {size}")
        if tiles.splits < 1:
            problems.append(f"tiles.splits must be >= 1, got {tiles.splits}")
    return problems


def fp32_out_mm(
    x: torch.Tensor,  # [M, K] bfloat16
    weight: torch.Tensor,  # [N, K] bfloat16, K contiguous
    tiles: Fp32OutTiles | None = None,  # None: default_tiles(M, N, K)
) -> torch.Tensor:  # [M, N] float32
    """``sum_k x[m, k] * weight[n, k]``, exact products added in fp32 (in an order set by the
    tiles, so within fp32 rounding of ``x.float() @ weight.float().T``). Raises ``ValueError``
    listing every problem with the arguments; checks shapes only (no device value is read)."""
    problems = _problems(x, weight, tiles)
    if problems:
        raise ValueError("fp32_out_mm: " + "; ".join(problems))
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    tiles = tiles or default_tiles(m, n, k)
    prepare_launch()
    if x.stride(1) != 1:
        x = x.contiguous()
    k_steps = triton.cdiv(k, tiles.block_k)
    steps_per_run = triton.cdiv(k_steps, tiles.splits)
    splits = triton.cdiv(k_steps, steps_per_run)  # no empty run
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), splits)
    if splits > 1:
        partials = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
        counts = zeroed_counters(grid[0] * grid[1], x.device)
    else:  # never read
        partials = counts = out
    pdl = pdl_options(x.device)
    _fp32_out_mm_kernel[grid](
        x, weight, out, partials, counts, m, n, k, x.stride(0), weight.stride(0), m * n,
        steps_per_run * tiles.block_k, MMA=wide_dtype(), BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, SPLITS=splits,
        PREFETCH_LINES=prefetch_lines(steps_per_run * tiles.block_k * 2) if pdl else 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl,
    )  # fmt: skip
    return out
