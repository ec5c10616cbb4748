"""dense.linear: ``x @ decode(W)^T`` with the weight read as stored (bf16, or block-FP8 codes);
dense.linear_a8w8: the same kernel over e4m3 activation codes (``A_FP8``).

One GEMM kernel, ``_linear_kernel``, plus ``_sum_splits_kernel`` when the reduction dimension is
split. Neither needs a device value on the host, and every allocation's size follows from the
shapes alone, so a decode step that calls them can be captured in a CUDA graph.

GEMM names here: ``x [M, K]``, ``W [N, K]``, ``out [M, N]`` (the contract's ``[T, C]``,
``[R, C]``, ``[T, R]``). The weight tile comes from moe.py's ``weight_tile``: e4m3 codes (exact
in bf16) go through the matrix units as they are, and each K step's partial product is
multiplied by its weight rows' 128x128 tile scale (a K step never crosses a scale tile: BLOCK_K
divides 128). The sum is the decoded weight's, in another order.

Tiles (:class:`LinearTiles`, chosen by the row count M in :func:`default_tiles`, or passed in to
sweep them):

- decode (M <= 64) is memory-bound: the weight is read once, so what matters is that every SM
  streams weight bytes. Row blocks of 16-64 against 64 weight rows, and the K dimension split
  in ``split_k`` ranges (enough programs for about two per SM, each range at least four K steps).
  Each range writes an fp32 partial ``[split_k, M, N]``; ``_sum_splits_kernel`` adds them in
  range order and rounds once to the output dtype.
- prefill (M > 64): row blocks of 64-128 against 128 weight rows, no split; ``group_m`` row
  blocks walk the weight tiles together, so a weight tile is read from L2 by each of them.
- ``swap_ab`` computes ``W_tile @ x_tile^T`` (the weight rows on the matrix units' M side, the
  few tokens on their N side: Hopper's wgmma reads its left operand from registers, where the
  decoded weight tile already is). A knob to sweep; off by default.

``linear_a8w8`` first quantizes ``x`` per token and 128 columns (activation_quant.py, one
launch, byte-exact to hwrun.formats), then runs the kernel with ``A_FP8``: both tiles go to the
matrix units as e4m3 (on Hopper an fp8 wgmma, no per-element conversion of the weight tile) and
each 128-wide K step's product is multiplied by the activation rows' and weight rows' scales.
On the H200 this halved the 64-row time of the large projections (docs/benchmarks.md).

``LinearTiles.tma`` (``dense.linear_a8w8`` only): both e4m3 tiles load through tensor
descriptors (Hopper's copy engine, straight into shared memory, zero past the edges), as the
paged logits' key pages do. The default on sm_90+ for 33-64 rows (``TMA_ROWS``), where it took
the engine's three projections 3-13% below the pointer loads on the H200; still 1.3-1.45x
DeepGEMM's GEMM there.

``LinearTiles.f16_products`` (``dense.linear`` over e4m3 weights; off by default, not yet
timed): ``x`` goes to f16 with a power-of-two scale per row and 128 columns (f16_rows.py, one
launch, exact as argued there) and the weight codes to f16: one conversion for two codes, where
bf16 takes about two instructions a code, one of them a quarter-rate conversion (the fused MoE's
decode kernels were bound by those on the H200). Each K step's product takes both scales, as
with ``A_FP8``.

Numerics against the reference (``hwrun.ops.linear``): the same bf16 inputs, exact fp32
products, fp32 sums, one rounding; the scale multiplies a 128-wide partial sum where the
reference rounds ``code * scale`` to fp32 first. The results differ by fp32 summation order,
enough to move a bf16 output by one unit now and then. Not batch-invariant: the tile shape and
split count change with M, and so does the summation order of a row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.activation_quant import quantize_activations
from hwrun.kernels.triton.descriptors import (
    nvidia_sm90_or_later,
    tma_alignment_problems,
    use_torch_allocator,
)
from hwrun.kernels.triton.f16_rows import F16_WEIGHT_FORMATS, rows_to_f16
from hwrun.kernels.triton.index_key_tiles import wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import (
    pdl_options,
    prefetch_lines,
    prefetch_to_l2,
    wait_for_previous_kernel,
)
from hwrun.kernels.triton.weight_tiles import (
    FORMAT_CODES,
    weight_scale_of_rows,
    weight_scales,
    weight_tile,
)
from hwrun.ops.linear import check_linear_a8w8_args, check_linear_args
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight

DECODE_ROWS = 64  # up to this many rows the op is memory-bound: decode tiles, split K
MIN_SPLIT_STEPS = 2  # K steps each split range keeps at least
PROGRAMS_PER_SM = 2  # decode: split K until about this many programs per SM
# Each split range writes an fp32 partial that the sum reads back: 8 bytes per row and output
# column, against at least 1 byte per weight element read. Splits are capped so that this
# traffic stays under half the weight's: split <= K / (16 * M). (K / (32 M) left 64-row steps
# on the narrow projections at 2 ranges: on the H200 kv_a [576, 4096] took 21 us at split 2
# and 8 us at split 8, q_a [1536, 4096] 21 and 11 us; K / (8 M) put the joined q_a+wk+kv_a
# [2240, 4096] at split 8, 12.5 us against 11.5 at split 4, a8w8, 2026-12-01.)
PARTIAL_TRAFFIC_DIVISOR = 16
# dense.linear_a8w8's rows that take tensor descriptors by default on sm_90+ (the 64-row
# decode tiles, 4 stages): at 64 rows on the H200 (2026-12-03) o_proj 18.2 -> 16.4 us,
# q_b+wq_b 16.9 -> 14.7, q_a+wk+kv_a 11.5 -> 11.2. Fewer rows: untimed.
TMA_ROWS = (33, DECODE_ROWS)
# With PDL (pdl.py): K steps of each program's weight rows prefetched to L2 before the wait
# for the kernel ahead (the activation quantizer, for dense.linear_a8w8).
PREFETCH_K_STEPS = 4
NARROW_N = 2048  # up to this many output columns decode tiles are 32 wide (more programs)


@dataclass(frozen=True)
class LinearTiles:
    """Launch shape of ``_linear_kernel``. ``block_k`` must divide 128 for block-FP8 weights
    (one scale tile per K step); block sizes are powers of two of at least 16 (the matrix
    units' smallest tile); ``split_k`` ranges of whole K steps."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 4
    f16_products: bool = False  # dense.linear over e4m3 weights: f16 products (module doc)
    tma: bool = False  # dense.linear_a8w8: x and W tiles through tensor descriptors (module doc)


# Starting points for the H200 (sm_90), to be swept with bench/linear_gpu.py --tune. Decode
# tiles take block_m 16, 32 or 64 (the rows rounded up) and a split_k from split_for.
DECODE_TILES = LinearTiles(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
MIDDLE_TILES = LinearTiles(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=3)
PREFILL_TILES = LinearTiles(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3)
INTERPRETER_TILES = LinearTiles(block_m=16, block_n=32, block_k=32, num_stages=1)
# The launch shapes bench/linear_gpu.py --tune times (with split_k swept on top of each decode
# shape); tests/kernels/test_gpu_kernels.py compiles every one.
DECODE_GRID = (
    LinearTiles(16, 32, 128, num_warps=4, num_stages=4),
    LinearTiles(16, 64, 128, num_warps=4, num_stages=4),
    LinearTiles(16, 128, 128, num_warps=4, num_stages=3),
    LinearTiles(16, 64, 64, num_warps=2, num_stages=6),
    LinearTiles(16, 64, 128, swap_ab=True, num_warps=4, num_stages=4),
    LinearTiles(32, 128, 128, swap_ab=True, num_warps=4, num_stages=3),
    LinearTiles(64, 64, 128, num_warps=4, num_stages=3),
    # wider weight tiles at 64 rows: each program re-reads the rows' activations per weight
    # tile, as many bytes as its weight tile at 64 x 64 with e4m3 on both sides (not yet timed)
    LinearTiles(64, 128, 128, num_warps=4, num_stages=3),
    LinearTiles(64, 128, 128, swap_ab=True, num_warps=4, num_stages=3),
    LinearTiles(64, 256, 128, num_warps=8, num_stages=3),
    # DeepGEMM's decode shape: narrow output tiles over the whole K, no split (so no partials
    # to write and sum), a deep pipeline per program (not yet timed)
    LinearTiles(64, 32, 128, num_warps=4, num_stages=6),
    LinearTiles(64, 64, 128, num_warps=4, num_stages=5),
    # dense.linear_a8w8 through tensor descriptors (the sweep skips them for dense.linear).
    # H200, 64 rows (2026-12-03): the first, 4 stages, won on all three engine projections
    # (now the default, TMA_ROWS); deeper pipelines and wider or narrower tiles lost.
    LinearTiles(64, 64, 128, num_warps=4, num_stages=4, tma=True),
    LinearTiles(64, 64, 128, num_warps=4, num_stages=6, tma=True),
    LinearTiles(64, 128, 128, num_warps=4, num_stages=4, tma=True),
    LinearTiles(64, 128, 128, num_warps=8, num_stages=4, tma=True),
    LinearTiles(64, 32, 128, num_warps=4, num_stages=8, tma=True),
    LinearTiles(16, 64, 128, num_warps=4, num_stages=6, tma=True),
    # f16 products (dense.linear over e4m3 weights; a8w8 ignores the flag), not yet timed
    LinearTiles(16, 32, 128, num_warps=4, num_stages=4, f16_products=True),
    LinearTiles(16, 64, 128, num_warps=4, num_stages=4, f16_products=True),
    LinearTiles(64, 64, 128, num_warps=4, num_stages=3, f16_products=True),
)
PREFILL_GRID = (
    LinearTiles(64, 128, 128, num_warps=4, num_stages=3),
    LinearTiles(128, 128, 128, num_warps=8, num_stages=3),
    LinearTiles(128, 128, 64, num_warps=4, num_stages=4),
    LinearTiles(128, 64, 128, num_warps=4, num_stages=4),
    LinearTiles(128, 256, 64, num_warps=8, num_stages=3),
    LinearTiles(128, 128, 128, group_m=1, num_warps=8, num_stages=3),
    LinearTiles(128, 128, 128, swap_ab=True, num_warps=8, num_stages=3),
)


@functools.cache
def multiprocessors(device_index: int) -> int:
    """The CUDA device's multiprocessors (cached: a properties query per call costs host time
    on every decode launch)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_for(tiles: LinearTiles, m: int, n: int, k: int, num_sms: int) -> int:
    """Ranges to split K into so that about ``PROGRAMS_PER_SM`` programs run per SM (1 when
    the output tiles already fill the device), each range keeping at least ``MIN_SPLIT_STEPS``
    K steps, the partials' traffic capped (``PARTIAL_TRAFFIC_DIVISOR``)."""
    m = max(m, 1)  # no rows: nothing is launched, any valid split will do
    output_tiles = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    k_steps = triton.cdiv(k, tiles.block_k)
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, output_tiles)
    cap = min(k_steps // MIN_SPLIT_STEPS, k // (PARTIAL_TRAFFIC_DIVISOR * m))
    split = max(1, min(wanted, cap))
    # A power of two: the H200's a8w8 sweep at 64 rows (2026-12-01) timed o_proj [4096, 8192]
    # at 26.5 us split 5 against 18.9 at split 4 and 22.6 at 8.
    split = 1 << (split.bit_length() - 1)
    return triton.cdiv(k_steps, triton.cdiv(k_steps, split))  # no empty range


def default_tiles(m: int, n: int, k: int, num_sms: int | None) -> LinearTiles:
    """Tiles for ``M`` rows against an ``[N, K]`` weight; ``num_sms`` None: the interpreter."""
    if num_sms is None:
        return INTERPRETER_TILES
    if m > DECODE_ROWS:
        return MIDDLE_TILES if m <= 256 else PREFILL_TILES
    tiles = replace(
        DECODE_TILES,
        block_m=16 if m <= 16 else 32 if m <= 32 else 64,
        block_n=32 if n <= NARROW_N else DECODE_TILES.block_n,
        # 64-row blocks: 3 stages were as fast as 5 in the sweep, with less shared memory
        num_stages=DECODE_TILES.num_stages if m <= 32 else 3,
    )
    return replace(tiles, split_k=split_for(tiles, m, n, k, num_sms))


@triton.jit
def _linear_kernel(
    x_ptr,  # [M, K] bf16, uint8 e4m3 codes (A_FP8) or scaled f16 (SCALED_A); row stride stride_xm
    xs_ptr,  # [M, K/128] fp32 scales of x's row groups (SCALED_A only), strides stride_xsm,
    # stride_xsk (tokens first where DeepGEMM's layout came from the norm: dense.linear_a8w8)
    w_ptr,  # [N, K] bf16, or uint8 e4m3 codes
    s_ptr,  # [ceil(N/128), ceil(K/128)] fp32 or e8m0 scales (fp8 only)
    out_ptr,  # [M, N] out dtype (SPLIT_K == 1), or [SPLIT_K, M, N] fp32 partials
    M,
    N,
    K,
    stride_xm,
    stride_xsm,
    stride_xsk,
    stride_wn,
    stride_sn,
    stride_om,
    stride_os,  # between split partials (0 without a split)
    k_per_split,  # K columns per split range, a multiple of BLOCK_K
    FORMAT: tl.constexpr,
    A_FP8: tl.constexpr,  # x is e4m3 codes (dense.linear_a8w8)
    SCALED_A: tl.constexpr,  # x carries a scale per row and 128 columns: A_FP8, or f16 products
    MMA: tl.constexpr,  # both tiles' dtype on the matrix units: bf16, e4m3 with A_FP8, f16 for
    # f16 products (fp32 in the interpreter for the first two, where either is exact)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    TMA: tl.constexpr,  # A_FP8 over e4m3 weights: both tiles through tensor descriptors
    PREFETCH_LINES: tl.constexpr = 0,  # with PDL: 128-byte lines of each weight row put in L2
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    # Grouped order: GROUP_M row blocks take the weight's column tiles in turn together.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    k_begin = split * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    if PREFETCH_LINES > 0:
        # The first K steps of this program's weight rows (no kernel writes weights), fetched
        # while the kernel ahead finishes.
        per_line: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth
        col = k_begin + tl.arange(0, PREFETCH_LINES) * per_line
        lines = w_ptr + n.to(tl.int64)[:, None] * stride_wn + col[None, :]
        prefetch_to_l2(lines, n_mask[:, None] & (col < k_end)[None, :], PDL)
    # Before any descriptor is built: its global scratch may be memory the kernel ahead used.
    wait_for_previous_kernel(PDL)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if TMA:
        # The copy engine loads both tiles into shared memory, zero past M, N and K, with no
        # address arithmetic or masks in the threads: the wgmma reads them from there.
        x_desc = tl.make_tensor_descriptor(
            x_ptr.to(tl.pointer_type(tl.float8e4nv)),
            shape=[M, K],
            strides=[stride_xm, 1],
            block_shape=[BLOCK_M, BLOCK_K],
        )
        w_desc = tl.make_tensor_descriptor(
            w_ptr.to(tl.pointer_type(tl.float8e4nv)),
            shape=[N, K],
            strides=[stride_wn, 1],
            block_shape=[BLOCK_N, BLOCK_K],
        )
        a_scale, scale = _step_scales(
            xs_ptr, s_ptr, m, m_mask, n, n_mask, pid_n, k_begin, k_end, stride_xsm, stride_xsk,
            stride_sn, FORMAT, SCALED_A, BLOCK_N,
        )  # fmt: skip
        for k0 in range(k_begin, k_end, BLOCK_K):
            a = x_desc.load([pid_m * BLOCK_M, k0]).to(MMA)
            w = w_desc.load([pid_n * BLOCK_N, k0]).to(MMA)
            a_next, scale_next = _step_scales(
                xs_ptr, s_ptr, m, m_mask, n, n_mask, pid_n, k0 + BLOCK_K, k_end, stride_xsm,
                stride_xsk, stride_sn, FORMAT, SCALED_A, BLOCK_N,
            )  # fmt: skip
            acc += tl.dot(a, tl.trans(w)) * (a_scale[:, None] * scale[None, :])
            a_scale, scale = a_next, scale_next
    else:
        a_scale, scale = _step_scales(
            xs_ptr, s_ptr, m, m_mask, n, n_mask, pid_n, k_begin, k_end, stride_xsm, stride_xsk,
            stride_sn, FORMAT, SCALED_A, BLOCK_N,
        )  # fmt: skip
        for k0 in range(k_begin, k_end, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_mask = kk < K  # a range ends at K or on a BLOCK_K boundary
            a = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0)
            if A_FP8:
                a = a.to(tl.float8e4nv, bitcast=True)
            a = a.to(MMA)
            # (weight_tile's own scales go unused, so the compiler drops their loads)
            w, _ = weight_tile(
                w_ptr, s_ptr, n, n_mask, k0, kk, k_mask, stride_wn, stride_sn, FORMAT, MMA
            )
            a_next, scale_next = _step_scales(
                xs_ptr, s_ptr, m, m_mask, n, n_mask, pid_n, k0 + BLOCK_K, k_end, stride_xsm,
                stride_xsk, stride_sn, FORMAT, SCALED_A, BLOCK_N,
            )  # fmt: skip
            if SCALED_A:
                # e4m3 times e4m3 (or f16 times f16), fp32 sums; both sides' scales of this K step
                # (inside one 128-column group, loaded a step ahead) multiply its partial product.
                if SWAP_AB:
                    acc += tl.dot(w, tl.trans(a)) * (scale[:, None] * a_scale[None, :])
                else:
                    acc += tl.dot(a, tl.trans(w)) * (a_scale[:, None] * scale[None, :])
            elif SWAP_AB:
                if FORMAT == 0:
                    acc = tl.dot(w, tl.trans(a), acc)
                else:
                    acc += tl.dot(w, tl.trans(a)) * scale[:, None]
            elif FORMAT == 0:
                acc = tl.dot(a, tl.trans(w), acc)
            else:
                acc += tl.dot(a, tl.trans(w)) * scale[None, :]
            a_scale, scale = a_next, scale_next
    out = out_ptr + split.to(tl.int64) * stride_os
    if SWAP_AB:
        ptrs = out + m.to(tl.int64)[None, :] * stride_om + n[:, None]
        mask = n_mask[:, None] & m_mask[None, :]
    else:
        ptrs = out + m.to(tl.int64)[:, None] * stride_om + n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _step_scales(
    xs_ptr,
    s_ptr,
    m,
    m_mask,
    n,
    n_mask,
    pid_n,
    k0,
    k_end,
    stride_xsm,
    stride_xsk,
    stride_sn,
    FORMAT: tl.constexpr,
    SCALED_A: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The scales of the K step at ``k0`` (none past ``k_end``): the activation rows' [BLOCK_M]
    (SCALED_A; else unused) and the weight rows' [BLOCK_N] (1 for bf16 weights). The loop loads
    them a step ahead: Triton's pipeliner leaves such loads (not feeding a dot) as plain loads in
    the step that multiplies by them, so each step's scaling waited on loads issued in that step.
    A tile of at most 128 weight rows (BLOCK_N divides 128: tiles are aligned to the scale rows)
    has one weight scale a step: one load, where a scale per row loaded the same address once
    for each of a thread's columns. The sm_90 code of Triton 3.6 for the 64 x 64 tensor-
    descriptor tiles: 18 loads a step, each used in its step, before; 3 now, each a step ahead,
    and 79 registers a thread against 122 (not yet timed on the H200)."""
    # The masks as tensors of the loads' shapes: the interpreter takes no Python bool for one.
    a_scale = tl.full(m.shape, 1.0, tl.float32)
    if SCALED_A:
        live_rows = m_mask & ((m * 0 + k0) < k_end)
        a_scale = tl.load(
            xs_ptr + m.to(tl.int64) * stride_xsm + (k0 // 128) * stride_xsk,
            mask=live_rows,
            other=0.0,
        )
    if FORMAT == 0:
        scale = tl.full(n.shape, 1.0, tl.float32)
    elif 128 % BLOCK_N == 0:
        live = (tl.zeros((), tl.int32) + k0) < k_end
        row_block = pid_n * BLOCK_N // 128
        scale = weight_scale_of_rows(s_ptr, row_block, k0, live, stride_sn, FORMAT)
        scale = tl.full(n.shape, 0.0, tl.float32) + scale
    else:
        live_cols = n_mask & ((n * 0 + k0) < k_end)
        scale = weight_scales(s_ptr, n, live_cols, k0, stride_sn, FORMAT)
    return a_scale, scale


@triton.jit
def _sum_splits_kernel(
    part_ptr,  # [SPLIT_K, M, N] float32
    out_ptr,  # [M, N] out dtype, row stride stride_om
    M,
    N,
    stride_om,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = n < N
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in tl.static_range(SPLIT_K):  # in range order: the sum's order is fixed
        acc += tl.load(part_ptr + (s * M + row) * N + n, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _check(
    x: torch.Tensor, weight: QuantizedWeight, tiles: LinearTiles, a8w8: bool = False
) -> None:
    """What this kernel cannot compute, beyond the contract's own checks."""
    op = "dense.linear_a8w8" if a8w8 else "dense.linear"
    problems = []
    if x.dtype != torch.bfloat16 and not a8w8:  # a8w8 multiplies x's exact e4m3 codes
        problems.append(
            f"x is {x.dtype}; the kernel multiplies bf16 on the matrix units (another dtype "
            "would be rounded to bf16 first, which is not the contract)"
        )
    sizes = {"block_m": tiles.block_m, "block_n": tiles.block_n, "block_k": tiles.block_k}
    for name, size in sizes.items():
        if size < 16 or size & (size - 1):
            problems.append(f"{name} must be a power of two >= 16, got {size}")
    if weight.format != "bf16" and FP8_BLOCK % tiles.block_k:
        problems.append(f"block_k {tiles.block_k} must divide the fp8 scale tile {FP8_BLOCK}")
    if a8w8 and tiles.block_k != FP8_BLOCK:
        problems.append(
            f"block_k {tiles.block_k} must be {FP8_BLOCK}: one activation scale per K step"
        )
    if tiles.tma and (not a8w8 or tiles.swap_ab or weight.format == "bf16"):
        problems.append(
            "tma reads e4m3 tiles on both sides: dense.linear_a8w8 over block-FP8 weights, "
            "without swap_ab"
        )
    if tiles.tma and weight.data.is_cuda:
        problems += tma_alignment_problems("the weight", weight.data)
    if tiles.split_k < 1 or tiles.group_m < 1:
        problems.append(f"split_k and group_m must be >= 1, got {tiles.split_k}, {tiles.group_m}")
    if problems:
        raise ValueError(f"{op} (triton): " + "; ".join(problems))


def linear(
    x: torch.Tensor,  # [T, C] bfloat16
    weight: QuantizedWeight,  # [R, C] bf16 / fp8_block128 / fp8_block128_ue8m0
    tiles: LinearTiles | None = None,
) -> torch.Tensor:  # [T, R] bfloat16
    """The contract of ``hwrun.ops.linear.linear`` through the Triton kernel (shape checks
    only: nothing here reads a device value)."""
    check_linear_args(x, weight)
    tiles = _tiles_for(x, weight, tiles)
    _check(x, weight, tiles)
    if tiles.f16_products and weight.format in F16_WEIGHT_FORMATS:
        return _launch(*rows_to_f16(x), weight, tiles, x.dtype)
    return _launch(x, None, weight, tiles, x.dtype)


def linear_a8w8(
    x: torch.Tensor,  # [T, C] bfloat16, C a multiple of 128
    weight: QuantizedWeight,  # [R, C] fp8_block128 / fp8_block128_ue8m0
    tiles: LinearTiles | None = None,
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # x's codes and scales
) -> torch.Tensor:  # [T, R] bfloat16
    """The contract of ``hwrun.ops.linear.linear_a8w8``: ``x`` quantized by
    activation_quant.py's kernel (or its codes and scales given as ``quantized``, read in any
    strides), then the GEMM over e4m3 codes on both sides (two launches, one with
    ``quantized``, one more with a split K; shape checks only)."""
    check_linear_a8w8_args(x, weight, quantized)
    if tiles is None:
        # one activation scale per K step (the GPU defaults already step 128 columns)
        tiles = replace(_tiles_for(x, weight, None), block_k=FP8_BLOCK)
        if (
            TMA_ROWS[0] <= x.shape[0] <= TMA_ROWS[1]
            and nvidia_sm90_or_later(x.device)
            and not tma_alignment_problems("the weight", weight.data)
        ):
            tiles = replace(tiles, tma=True, num_stages=4)
    _check(x, weight, tiles, a8w8=True)
    if quantized is None:
        quantized = quantize_activations(x, ue8m0=weight.format == "fp8_block128_ue8m0")
    codes, scales = quantized
    return _launch(codes, scales, weight, tiles, x.dtype)


def _tiles_for(x: torch.Tensor, weight: QuantizedWeight, tiles: LinearTiles | None) -> LinearTiles:
    if tiles is not None:
        return tiles
    sms = multiprocessors(x.device.index or 0) if x.is_cuda else None
    return default_tiles(x.shape[0], weight.shape[0], x.shape[1], sms)


def _launch(
    x: torch.Tensor,  # [M, K] bf16, or e4m3 codes (uint8) / scaled f16 with x_scales
    x_scales: torch.Tensor | None,  # [M, K/128] fp32
    weight: QuantizedWeight,
    tiles: LinearTiles,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [M, N] out_dtype
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    prepare_launch()
    if x.stride(-1) != 1:
        x = x.contiguous()
    data = weight.data if weight.data.stride(-1) == 1 else weight.data.contiguous()
    scales = data if weight.scales is None else weight.scales.contiguous()
    scaled_a = x_scales is not None
    a_fp8 = x.dtype == torch.uint8
    mma = tl.float16 if x.dtype == torch.float16 else wide_dtype()
    if a_fp8 and mma == tl.bfloat16:  # compiled: e4m3 on the matrix units
        mma = tl.float8e4nv
    k_steps = triton.cdiv(k, tiles.block_k)
    steps_per_split = triton.cdiv(k_steps, tiles.split_k)
    split = triton.cdiv(k_steps, steps_per_split)
    partials = out
    if split > 1:
        partials = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n), split)
    if tiles.tma and x.is_cuda:
        use_torch_allocator()
    pdl = pdl_options(x.device)
    _linear_kernel[grid](
        x, x_scales if scaled_a else x, data, scales, partials, m, n, k,
        x.stride(0), x_scales.stride(0) if scaled_a else 0, x_scales.stride(1) if scaled_a else 0,
        data.stride(0),
        scales.stride(0) if weight.scales is not None else 0,
        n if split > 1 else out.stride(0), m * n if split > 1 else 0,
        steps_per_split * tiles.block_k,
        FORMAT=FORMAT_CODES[weight.format], A_FP8=a_fp8, SCALED_A=scaled_a, MMA=mma,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m, SWAP_AB=tiles.swap_ab, TMA=tiles.tma,
        PREFETCH_LINES=prefetch_lines(
            min(PREFETCH_K_STEPS, steps_per_split) * tiles.block_k * data.element_size()
        ) if pdl else 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl,
    )  # fmt: skip
    if split > 1:
        block = min(1024, triton.next_power_of_2(n))
        _sum_splits_kernel[(m, triton.cdiv(n, block))](
            partials, out, m, n, out.stride(0), SPLIT_K=split, BLOCK=block, **pdl
        )
    return out
