"""indexer.logits_ragged over fp8 index keys as a Gluon kernel for Hopper (sm_90).

The prefill's logits are bound by arithmetic, not bytes: at M=4096 x N=16384 x 64 heads each
key is read by every row of a 4096-row chunk. The Triton kernel
(hwrun.kernels.triton.indexer_logits_ragged) scores 4 query rows x 64 heads side by side against
a 64-key tile, one [64, 256] fp8 product a tile, and ran at 1.24x DeepGEMM's time on an H100.
Triton waits for each product right after issuing it (its async-dot pass defers a wait only for
an accumulator carried into the next product), so a tile's head sums, ~470 instructions a
thread, never overlap a product (512 tensor-core cycles a multiprocessor at the fp8 peak).

Here each tile's product is issued async and runs while the previous tile's logits are summed,
masked and stored. Program (key span, row group): ROWS query rows (256 // HP: 4 at 64 heads)
side by side as the product's 256 columns, two warpgroups each owning 128 of them (warps
[4, 2]); the span's key tiles go by cp.async into a ring of shared-memory stages in the layout
the MMA reads, the queries once into shared memory. Each key's fp32 scale multiplies its head
sum (a positive scale commutes with relu), gathered a tile ahead in the sums' own layout.

Measured on an H100 (2026-12-06, M=4096 N=16384 H=64, a causal chunk): within 1.6e-4 of the
reference (largest error over the largest logit) at 4 shapes x 3 spans x 2 ring depths, the
Triton kernel's output bit for bit at the bench shape, conformant while it was registered
(22 cases run, 22 passed, DeepGEMM absent); but 1190 us at best (3 stages, spans of 128
tiles) against DeepGEMM's 990 and the Triton kernel's 1051 (since it moved the key scale after
the head sum).
ncu: 575M instructions against Triton's 452M (two warpgroups each pay the loop's addressing,
copies and waits that one warpgroup pays for a whole tile in Triton's), the same ~1.9 a cycle,
shared memory the busiest pipe (40%). So it is not registered. plugins/nvidia/tests/
test_gluon_ragged_gpu.py (written after that run, not yet run) and ``bench/gpu_ops.py --only
ragged`` keep it measurable, and its sm_90 cubin is built and read in CI
(plugins/nvidia/tests/test_gluon.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from hwrun.kernels.triton.indexer_logits_ragged import default_tiles
from hwrun_nvidia.gluon_paged_logits import FP8_OPERAND_SMEM, _copy, _mma_result

BLOCK_N = gl.constexpr(64)  # keys a tile: the MMA's 64 rows
HEAD_DIM = gl.constexpr(128)
COLS = gl.constexpr(256)  # the product's columns: ROWS query rows x HP heads
MAX_HEADS = 128  # two rows a program at least
STAGES = 4  # key tiles in flight or in hand: 8 KiB each, beside 32 KiB of queries


@gluon.jit
def _head_sums(acc, w, ROWS: gl.constexpr, HP: gl.constexpr):
    """[64, ROWS] sum_h w_h relu(acc) of each key and query row (acc [64, ROWS * HP]); relu
    keeps NaN, as torch's does."""
    relu = gl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    return gl.sum(gl.reshape(relu * gl.expand_dims(w, 0), [BLOCK_N, ROWS, HP]), axis=2)


@gluon.jit
def _in_sums_layout(grid, ROWS: gl.constexpr, HP: gl.constexpr):
    """An index grid [64, ROWS * HP], constant over each row's heads, as [64, ROWS] in the
    layout _head_sums returns (the same reshape and reduction)."""
    return gl.max(gl.reshape(grid, [BLOCK_N, ROWS, HP]), axis=2)


@gluon.jit
def _tile_scales(scale_ptr, scale_stride, scale_offs, t, last, N, key_idx):
    """Tile t's key scales [64, ROWS] in the sums' layout (0 past ``last`` or N), gathered an
    iteration before they are used so that the load's latency falls behind a product;
    ``scale_offs``: each key's offset in the tile (key_idx * scale_stride)."""
    tile = scale_ptr + (t * BLOCK_N).to(gl.int64) * scale_stride
    live = (t * BLOCK_N + key_idx < N) & (t < last)
    return gl.load((tile + scale_offs).to(gl.pointer_type(gl.float32)), mask=live, other=0.0)


@gluon.jit
def _issue_tile(keys_ring, stage, t, last, elem_ptr, elem_stride, N, key_rows, key_cols,
                key_offs):  # fmt: skip
    """cp.async of key tile t into ring ``stage`` as one commit group (nothing read for a tile
    at or past ``last``, or for keys past N: their products are never stored); ``key_offs``:
    each byte's offset in the tile [64, 128]."""
    tile = elem_ptr.to(gl.pointer_type(gl.float8e4nv)) + (t * BLOCK_N).to(gl.int64) * elem_stride
    live = gl.expand_dims((t * BLOCK_N + key_rows < N) & (t < last), 1)
    live = live & gl.expand_dims(key_cols < HEAD_DIM, 0)  # as the offsets' shape
    _copy(keys_ring.index(stage), tile + key_offs, mask=live)
    async_copy.commit_group()


@gluon.jit
def _store_tile(acc, w, scale, t, last, key_idx, starts, ends, out_rows, row_ok, N,
                ROWS: gl.constexpr, HP: gl.constexpr):  # fmt: skip
    """Tile t's logits: each row's head sums times the key scales inside the row's window,
    -inf outside it (by selection: a NaN key must not reach a row that does not read it);
    nothing for a tile at or past ``last``."""
    n = t * BLOCK_N + key_idx
    logits = _head_sums(acc, w, ROWS, HP) * scale
    logits = gl.where((n >= starts) & (n < ends), logits, float("-inf"))
    gl.store(out_rows + n, logits, mask=row_ok & (n < N) & (t < last))


@gluon.jit
def _fill_tiles(begin, end, key_idx, out_rows, row_ok, N):
    """-inf over key tiles begin..end-1 of the program's rows (tiles no row's window reaches)."""
    neg_inf = gl.full_like(key_idx, float("-inf"), dtype=gl.float32)
    for t in range(begin, end):
        n = t * BLOCK_N + key_idx
        gl.store(out_rows + n, neg_inf, mask=row_ok & (n < N))


@gluon.jit
def _ragged_fp8_kernel(
    q_ptr,  # [M, H, 128] float8_e4m3fn
    w_ptr,  # [M, H] float32
    elem_ptr,  # [N, 128] uint8: e4m3 codes
    scale_ptr,  # [N, 4] uint8: fp32 scales
    ks_ptr,  # [M] int32
    ke_ptr,  # [M] int32
    out_ptr,  # [M, N] float32
    M,
    N,
    elem_stride,
    scale_stride,
    tiles,  # key tiles a program's span holds
    H: gl.constexpr,
    HP: gl.constexpr,
    ROWS: gl.constexpr,
    STAGES: gl.constexpr,
):
    """Program (span, row group): key tiles [first, last) of its span, the hull of its rows'
    windows, scored with each tile's product async beside the previous tile's logits; the
    span's other tiles only written as -inf."""
    gl.static_assert(gl.num_warps() == 8, "two warpgroups, 128 product columns each")
    gl.static_assert(ROWS * HP == COLS, "the rows' heads fill the product's 256 columns")
    gl.static_assert(STAGES >= 2, "a tile in hand and one in flight")
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, COLS // 2, 32]
    )
    heads_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    tile_rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    copy_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [8, 1], [1, 0])
    row0 = gl.program_id(1) * ROWS

    # Each product column's query row and head; each key and row of the sums' layout.
    cols = gl.arange(0, COLS, layout=heads_layout)
    col_row, col_head = row0 + cols // HP, cols % HP
    col_ok = (col_head < H) & (col_row < M)
    w = gl.load(w_ptr + col_row.to(gl.int64) * H + col_head, mask=col_ok, other=0.0)
    keys0 = gl.arange(0, BLOCK_N, layout=tile_rows_layout)
    key_idx = _in_sums_layout(gl.expand_dims(keys0, 1) + gl.expand_dims(cols * 0, 0), ROWS, HP)
    row = _in_sums_layout(gl.expand_dims(keys0 * 0, 1) + gl.expand_dims(col_row, 0), ROWS, HP)
    row_ok = row < M
    starts = gl.load(ks_ptr + row, mask=row_ok, other=0)
    ends = gl.load(ke_ptr + row, mask=row_ok, other=0)
    out_rows = out_ptr + row.to(gl.int64) * N

    # The span's tiles [first, last) reach some row's window: the hull of the rows' windows.
    holds = row_ok & (ends > starts)
    span = gl.program_id(0) * tiles
    span_end = gl.minimum(span + tiles, gl.cdiv(N, BLOCK_N))
    first = gl.maximum(span, gl.min(gl.min(gl.where(holds, starts, N), 1), 0) // BLOCK_N)
    hull_end = gl.cdiv(gl.max(gl.max(gl.where(holds, ends, 0), 1), 0), BLOCK_N)
    last = gl.maximum(first, gl.minimum(span_end, hull_end))
    _fill_tiles(span, first, key_idx, out_rows, row_ok, N)
    _fill_tiles(last, span_end, key_idx, out_rows, row_ok, N)

    key_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, copy_layout))
    key_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, copy_layout))
    key_offs = gl.expand_dims(key_rows * elem_stride, 1) + gl.expand_dims(key_cols, 0)
    keys_ring = gl.allocate_shared_memory(
        gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], FP8_OPERAND_SMEM
    )
    for s in gl.static_range(STAGES - 1):
        _issue_tile(
            keys_ring, s, first + s, last, elem_ptr, elem_stride, N, key_rows, key_cols,
            key_offs,
        )  # fmt: skip

    # The queries, [COLS, 128] K contiguous: the MMA's right operand (0 for padded heads).
    q_cols = gl.arange(0, COLS, layout=gl.SliceLayout(1, copy_layout))
    q_row, q_head = row0 + q_cols // HP, q_cols % HP
    q_ok = (q_head < H) & (q_row < M)
    q = gl.load(
        q_ptr
        + gl.expand_dims((q_row.to(gl.int64) * H + q_head) * HEAD_DIM, 1)
        + gl.expand_dims(key_cols, 0),
        mask=gl.expand_dims(q_ok, 1),
        other=0.0,
    )
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [COLS, HEAD_DIM], FP8_OPERAND_SMEM, q)

    # Tile ``first``'s product, then two tiles an iteration: each product in one of two
    # accumulators that trade roles (one carried across iterations would cost a register move
    # per element a tile), issued async beside the other's logits. A loop with no branch, so
    # that ptxas waits for no product early; an odd count scores one tile past ``last``,
    # unread and unstored.
    scale_offs = key_idx * scale_stride
    scale_next = _tile_scales(scale_ptr, scale_stride, scale_offs, first, last, N, key_idx)
    zero = gl.zeros([BLOCK_N, COLS], gl.float32, acc_layout)
    even, even_scale, scale_next = _score_tile(
        keys_ring, q_smem, zero, 0, first, last, elem_ptr, elem_stride, scale_ptr, scale_stride,
        scale_offs, N, key_rows, key_cols, key_offs, scale_next, zero, scale_next, key_idx, w,
        starts, ends, out_rows, row_ok, False, ROWS, HP, STAGES,
    )  # fmt: skip
    for t in range(first + 1, last, 2):
        odd, odd_scale, scale_next = _score_tile(
            keys_ring, q_smem, zero, t - first, t, last, elem_ptr, elem_stride, scale_ptr,
            scale_stride, scale_offs, N, key_rows, key_cols, key_offs, scale_next, even,
            even_scale, key_idx, w, starts, ends, out_rows, row_ok, True, ROWS, HP, STAGES,
        )  # fmt: skip
        even, even_scale, scale_next = _score_tile(
            keys_ring, q_smem, zero, t + 1 - first, t + 1, last, elem_ptr, elem_stride,
            scale_ptr, scale_stride, scale_offs, N, key_rows, key_cols, key_offs, scale_next,
            odd, odd_scale, key_idx, w, starts, ends, out_rows, row_ok, True, ROWS, HP, STAGES,
        )  # fmt: skip
    # ``even`` holds the tile after the loop's last pair: last - 1, or the one past it.
    pairs = (last - first) // 2
    _store_tile(even, w, even_scale, first + 2 * pairs, last, key_idx, starts, ends, out_rows,
                row_ok, N, ROWS, HP)  # fmt: skip
    async_copy.wait_group(0)  # no copy outlives the program


@gluon.jit
def _score_tile(
    keys_ring, q_smem, zero, i, t, last, elem_ptr, elem_stride, scale_ptr, scale_stride,
    scale_offs, N, key_rows, key_cols, key_offs, scale_next, prev, prev_scale, key_idx, w,
    starts, ends, out_rows, row_ok, STORE_PREV: gl.constexpr, ROWS: gl.constexpr,
    HP: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """The program's i-th tile t: its product issued async, tile t - 1's logits (``prev``)
    stored beside it (``STORE_PREV``); returns the product, its key scales and tile t + 1's
    scales."""
    # Into the stage of tile t - 1, whose product every warpgroup has waited for.
    _issue_tile(
        keys_ring, (i + STAGES - 1) % STAGES, t + STAGES - 1, last, elem_ptr, elem_stride, N,
        key_rows, key_cols, key_offs,
    )  # fmt: skip
    async_copy.wait_group(STAGES - 1)  # tile t's group, the oldest
    fence_async_shared()  # the copies before the MMA's async-proxy reads
    scale = scale_next
    scale_next = _tile_scales(scale_ptr, scale_stride, scale_offs, t + 1, last, N, key_idx)
    pending = warpgroup_mma(
        keys_ring.index(i % STAGES), q_smem.permute((1, 0)), zero, use_acc=False, is_async=True
    )
    if STORE_PREV:
        _store_tile(prev, w, prev_scale, t - 1, last, key_idx, starts, ends, out_rows, row_ok, N,
                    ROWS, HP)  # fmt: skip
    return _mma_result(pending), scale, scale_next


def rows_a_program(heads: int) -> int:
    """Query rows side by side in a program's 256 product columns."""
    return COLS.value // max(16, triton.next_power_of_2(heads))


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, 128] uint8
    key_scales: torch.Tensor,  # [N, 4] uint8
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
    tiles: int | None = None,
    stages: int = STAGES,
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    """The kernel's launch, for shapes :func:`shape_reasons` accepts. ``tiles``: key tiles a
    program (default the Triton kernel's
    :func:`~hwrun.kernels.triton.indexer_logits_ragged.default_tiles`); ``stages``: key tiles
    in flight or in hand (at least 2)."""
    if stages < 2:
        raise ValueError(f"gluon logits_ragged: stages={stages}, at least 2 are needed")
    M, H = q.shape[0], q.shape[1]
    N = key_elements.shape[0]
    out = torch.empty((M, N), dtype=torch.float32, device=q.device)
    if M == 0 or N == 0:
        return out
    rows = rows_a_program(H)
    key_tiles = triton.cdiv(N, BLOCK_N.value)
    if tiles is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        tiles = default_tiles(key_tiles, triton.cdiv(M, rows), sms)
    if tiles < 1:
        raise ValueError(f"gluon logits_ragged: tiles must be at least 1, got {tiles}")
    _ragged_fp8_kernel[(triton.cdiv(key_tiles, tiles), triton.cdiv(M, rows))](
        q.contiguous(),
        weights.contiguous(),
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
        HP=max(16, triton.next_power_of_2(H)),
        ROWS=rows,
        STAGES=stages,
        num_warps=8,
    )
    return out


def shape_reasons(
    q: torch.Tensor, weights: torch.Tensor, key_elements: torch.Tensor, key_scales: torch.Tensor,
    fmt: str,
) -> list[str]:  # fmt: skip
    """Why this kernel cannot take the call (empty when it can)."""
    reasons = []
    if fmt != "fp8":
        reasons.append(f"it reads fp8 index keys, got {fmt!r}")
    if q.dtype != torch.float8_e4m3fn:
        reasons.append(f"it multiplies fp8 queries, got {q.dtype}")
    if q.dim() != 3 or q.shape[2] != HEAD_DIM.value or not 0 < q.shape[1] <= MAX_HEADS:
        reasons.append(f"it takes q [M, H <= {MAX_HEADS}, {HEAD_DIM.value}], got {tuple(q.shape)}")
    if weights.dtype != torch.float32:
        reasons.append(f"it reads float32 head weights, got {weights.dtype}")
    if key_elements.dim() != 2 or key_elements.shape[1] != HEAD_DIM.value:
        reasons.append(f"it reads keys [N, 128], got {tuple(key_elements.shape)}")
    elif key_elements.stride(1) != 1 or key_elements.stride(0) % 16 or key_elements.data_ptr() % 16:
        reasons.append("it copies 16-byte chunks: key rows contiguous, 16-byte aligned")
    if key_scales.dim() != 2 or key_scales.shape[1] != 4 or key_scales.stride(1) != 1:
        reasons.append(
            f"it reads contiguous fp32 scales [N, 4] bytes, got {tuple(key_scales.shape)}"
        )
    elif key_scales.stride(0) % 4 or key_scales.data_ptr() % 4:
        reasons.append("it loads each key's scale as one fp32: 4-byte aligned rows")
    return reasons
