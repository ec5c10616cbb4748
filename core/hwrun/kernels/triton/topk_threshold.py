"""indexer.topk through a threshold from segment maxima: each row is read once in full and again
only in the segments that reach the threshold (about a quarter of a 131072-column row), and the
exact selection runs over a few thousand candidates held in registers.

1. ``_segment_max`` (rows x tiles programs): the largest key of every aligned segment of
   ``2**level`` columns of the row's window; ``level`` is per row, the smallest that leaves at
   most ``M + SLACK`` segments (``M >= 4k``, ``SLACK = M/64``), so a window longer than M
   columns keeps more than M/2 >= 2k of them (and a short window in a long padded row keeps
   fine segments). Segments 0 .. M-1 are the head, the at most SLACK after them the tail.
2. ``_threshold`` (one program per row): T, the k-th largest of the head's segment maxima
   rounded down to its top ``THRESHOLD_BITS`` bits, by a bitwise search over the M maxima in
   registers that stops at the first value with exactly k maxima at or above it
   (``ThresholdTiles.early_exit``; with ``ThresholdTiles.radix_search``, 4 or 8 bits a round by
   histograms). The maxima are k distinct columns scoring >= T, so T is never above the row's
   k-th key: every column of the result, ties at the k-th key included, scores >= T. The
   tail's maxima do not vote, so the search's tile stays M wide (with them T could only be
   higher: a few candidates fewer). With ``ThresholdTiles.fold_threshold`` there is no such
   launch: each row's last ``_segment_max`` program to finish (an arrival count per row, reset
   by that program) searches T in its place.
3. ``_compact`` (rows x chunks programs): the window's keys >= T, read only in segments whose
   maximum reaches T (the tail's too), appended to a per-row buffer of ``CAP`` slots (one
   atomic per tile, the next tile's loads issued before it). With ``ThresholdTiles.by_segment``,
   ``_threshold`` also lists the segments whose maximum reaches T (the head's, then the
   tail's) and ``_compact_live`` reads only their columns, as flat tiles of that list (on the
   H200, ``_compact`` at 64 x 131072 took 52 us a layer, 4x a full read of the rows: a scan and
   an atomic in each of 128 tiles a row).
4. ``select_candidates`` (topk_select.py; one program per row): the exact k-th key among the
   candidates by a search in registers (bit by bit, or by histograms as in 2); ties at it go
   by smallest index. A row with more than ``CAP`` candidates (heavy ties, scores clustered in
   whole segments) takes an exact slow path in the same program: 8-bit radix histograms over
   its window, then one ordered sweep.

With m segments, min(m, M) of them voting, and independent scores a row has about
-m ln(1 - k/min(m, M)) candidates (2357 for m = M = 8192, k = 2048; 2358 for m = 8196, a
32782-column row at level 2; under 1.39k while m > 2k). Nothing waits on the host and
allocations depend on shapes only, so a CUDA graph captures it. Keys are the radix kernel's
order-preserving uint32 (NaN as -inf, -0.0 as +0.0). The output order is the candidates'
(atomic) order: the contract compares sets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel
from hwrun.kernels.triton.topk import _sortable_key, checked_args
from hwrun.kernels.triton.topk import topk as radix_topk
from hwrun.kernels.triton.topk_select import (
    COUNT_STRIDE,
    kth_largest,
    kth_largest_radix,
    kth_largest_until_exact,
    select_candidates,
    window,
)

# k above this goes to the radix kernel: M >= 4k segment maxima and the candidate tile live in
# registers of one program, 8192 keys (+ indices) at 8 warps being 32 (+ 32) registers a thread.
MAX_K = 4096


@triton.jit
def _row_level(start, end, M: tl.constexpr, SLACK: tl.constexpr, LEVELS: tl.constexpr):
    """The smallest level whose aligned segments of 2**level columns cover [start, end) with at
    most M + SLACK of them (the host's ``_levels``, by the same rule, makes the last level cover
    a whole row)."""
    level = start * 0
    for lvl in tl.static_range(LEVELS - 1):
        level += ((((end - 1) >> lvl) - (start >> lvl) + 1) > M + SLACK).to(tl.int32)
    return level


@triton.jit
def _segment_max(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    max_ptr,  # [R, M + SLACK] int32: uint32 keys, the first nseg of each row written
    row_stride,
    L,
    k,
    # FOLD: _threshold's outputs, written by each row's last program to finish, and the
    # row's arrival counters (int32 [R], zero before the launch and left zero after it)
    thresh_ptr,
    count_ptr,
    live_ptr,
    nlive_ptr,
    arrived_ptr,
    M: tl.constexpr,
    SLACK: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK: tl.constexpr,
    FOLD: tl.constexpr = False,
    BITS: tl.constexpr = 16,
    LIST: tl.constexpr = True,
    PAIRS: tl.constexpr = False,
    RADIX: tl.constexpr = False,
    EARLY: tl.constexpr = True,
    RADIX_BITS: tl.constexpr = 8,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1) * BLOCK
    start, end = window(starts_ptr, ends_ptr, row, L)
    if (end - start > k) & (lo < end) & (lo + BLOCK > start):
        level = _row_level(start, end, M, SLACK, LEVELS)
        idx = lo + tl.arange(0, BLOCK)
        # Masked by the row end only (a multiple of 16 in the models): 16-byte vector loads.
        x = tl.load(logits_ptr + row * row_stride + idx, mask=idx < L, other=0.0)
        key = _sortable_key(x)
        key = tl.where((idx >= start) & (idx < end), key, tl.zeros_like(key))
        for lvl in tl.static_range(LEVELS):
            if level == lvl:
                seg_max = tl.max(tl.reshape(key, (BLOCK >> lvl, 1 << lvl)), axis=1)
                seg = (lo >> lvl) - (start >> lvl) + tl.arange(0, BLOCK >> lvl)
                nseg = ((end - 1) >> lvl) - (start >> lvl) + 1
                tl.store(
                    max_ptr + row * (M + SLACK) + seg,
                    seg_max.to(tl.int32, bitcast=True),
                    mask=(seg >= 0) & (seg < nseg),
                )
    if FOLD:
        # Every program of the row arrives (those outside its window too); the last searches T
        # over the maxima the others stored, in place of a _threshold launch after this one.
        tl.debug_barrier()  # every thread's maxima stored before the count says so
        tiles = tl.num_programs(1)
        if tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel", scope="gpu") == tiles - 1:
            tl.store(arrived_ptr + row, 0)  # for the next launch (a graph replays this one)
            _row_threshold(
                row, starts_ptr, ends_ptr, max_ptr, thresh_ptr, count_ptr, live_ptr, nlive_ptr,
                L, k, M, SLACK, LEVELS, BITS, LIST, PAIRS, RADIX, EARLY, RADIX_BITS,
            )  # fmt: skip


@triton.jit
def _threshold(
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    max_ptr,  # [R, M + SLACK] int32
    thresh_ptr,  # [R] int32: uint32 key T
    count_ptr,  # [R, COUNT_STRIDE] int32: column 0 zeroed here for _compact
    live_ptr,  # [R, M + SLACK] int32: with LIST, the segments whose maximum reaches T, in order
    nlive_ptr,  # [R] int32: with LIST, how many
    L,
    k,
    M: tl.constexpr,
    SLACK: tl.constexpr,
    LEVELS: tl.constexpr,
    BITS: tl.constexpr,
    LIST: tl.constexpr,
    PAIRS: tl.constexpr,
    RADIX: tl.constexpr,
    EARLY: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    _row_threshold(
        tl.program_id(0).to(tl.int64), starts_ptr, ends_ptr, max_ptr, thresh_ptr, count_ptr,
        live_ptr, nlive_ptr, L, k, M, SLACK, LEVELS, BITS, LIST, PAIRS, RADIX, EARLY,
        RADIX_BITS,
    )  # fmt: skip


# fmt: off
@triton.jit
def _row_threshold(
    row, starts_ptr, ends_ptr, max_ptr, thresh_ptr, count_ptr, live_ptr, nlive_ptr, L, k,
    M: tl.constexpr, SLACK: tl.constexpr, LEVELS: tl.constexpr,  # _threshold's, as there
    BITS: tl.constexpr, LIST: tl.constexpr, PAIRS: tl.constexpr, RADIX: tl.constexpr,
    EARLY: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    # fmt: on
    """Row ``row``'s T (and with LIST its live segments) from its stored segment maxima: the
    body of _threshold, and of _segment_max's last program of a row under FOLD."""
    start, end = window(starts_ptr, ends_ptr, row, L)
    tl.store(count_ptr + row * COUNT_STRIDE, 0)
    if end - start > k:
        level = _row_level(start, end, M, SLACK, LEVELS)
        nseg = ((end - 1) >> level) - (start >> level) + 1
        max_row = max_ptr + row * (M + SLACK)
        seg = tl.arange(0, M)
        # The whole row is allocated: an unmasked (vector) load, unwritten entries zeroed. T
        # from the head only: more than k segments whenever the window has more than k columns.
        # .cg: from L2, where _segment_max's other programs stored them (FOLD)
        seg_max = tl.load(max_row + seg, cache_modifier=".cg").to(tl.uint32, bitcast=True)
        seg_max = tl.where(seg < nseg, seg_max, tl.zeros_like(seg_max))
        # T lies between the smallest and the largest of the (at least k) maxima: the searches
        # copy the leading bits those two share instead of searching them. On an H100
        # (2026-12-07, indexer-like rows) this took _threshold from 15.6 to 12.8 us at 64 x
        # 131072 and 10.1 to 8.8 at 1 x 131072, but 10.9 to 11.6 at 64 x 32782 (4-column
        # segments there): the extra reduction can cost more than the rounds it saves.
        lo, hi = tl.reduce(
            (tl.where(seg < nseg, seg_max, tl.zeros_like(seg_max) | 0xFFFFFFFF), seg_max),
            0,
            _min_max,
        )
        if RADIX:
            t, _, _ = kth_largest_radix(seg_max, k, lo, hi, BITS, RADIX_BITS)
        elif EARLY:
            # Exactly k maxima >= t: k distinct columns score >= t, all T needs.
            t, _ = kth_largest_until_exact(seg_max, k, lo, hi, BITS)
        else:
            t = kth_largest(seg_max, k, lo, hi, BITS, PAIRS)
        tl.store(thresh_ptr + row, t.to(tl.int32, bitcast=True))
        if LIST:
            live_row = live_ptr + row * (M + SLACK)
            live = (seg < nseg) & (seg_max >= t)
            pos = tl.cumsum(live.to(tl.int32), 0) - 1
            tl.store(live_row + pos, seg, mask=live)
            nlive = tl.sum(live.to(tl.int32), 0)
            # The tail votes for no T but holds columns >= T: listed after the head's. Skipped
            # without one (its scan took 0.4 us of ~10.5 on the H200 at 64 x 32768).
            if nseg > M:
                tail = M + tl.arange(0, SLACK)
                tail_max = tl.load(max_row + tail, cache_modifier=".cg")
                tail_max = tail_max.to(tl.uint32, bitcast=True)
                tail_live = (tail < nseg) & (tail_max >= t)
                tail_pos = nlive + tl.cumsum(tail_live.to(tl.int32), 0) - 1
                tl.store(live_row + tail_pos, tail, mask=tail_live)
                nlive += tl.sum(tail_live.to(tl.int32), 0)
            tl.store(nlive_ptr + row, nlive)


@triton.jit
def _min_max(lo0, hi0, lo1, hi1):
    return tl.minimum(lo0, lo1), tl.maximum(hi0, hi1)


@triton.jit
def _compact(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    max_ptr,  # [R, M + SLACK] int32: the tail's maxima too
    thresh_ptr,  # [R] int32
    count_ptr,  # [R, COUNT_STRIDE] int32: column 0 the row's candidates (> CAP: slow path)
    cand_key_ptr,  # [R, CAP] int32
    cand_idx_ptr,  # [R, CAP] int32
    row_stride,
    L,
    k,
    chunk,
    M: tl.constexpr,
    SLACK: tl.constexpr,
    LEVELS: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    start, end = window(starts_ptr, ends_ptr, row, L)
    if end - start > k:
        level = _row_level(start, end, M, SLACK, LEVELS)
        first_seg = start >> level
        t = tl.load(thresh_ptr + row).to(tl.uint32, bitcast=True)
        row_ptr = logits_ptr + row * row_stride
        max_row = max_ptr + row * (M + SLACK) - first_seg
        lo = tl.maximum(part * chunk, (start // BLOCK) * BLOCK)
        hi = tl.minimum(part * chunk + chunk, end)
        # Loads run ahead of each tile's scan and atomic, which would otherwise wait on them:
        # the next tile's scores and the segment maxima of the one after. Columns of segments
        # whose maximum is below T (no candidate there) are never read.
        idx = lo + tl.arange(0, BLOCK)
        live = _inside(idx, start, hi) & (_segment_maxima(max_row, idx, level, start, hi) >= t)
        x = tl.load(row_ptr + idx, mask=live, other=0.0)
        maxima_next = _segment_maxima(max_row, idx + BLOCK, level, start, hi)
        for _ in range(lo, hi, BLOCK):
            live_next = _inside(idx + BLOCK, start, hi) & (maxima_next >= t)
            x_next = tl.load(row_ptr + idx + BLOCK, mask=live_next, other=0.0)
            maxima_next = _segment_maxima(max_row, idx + 2 * BLOCK, level, start, hi)
            key = _sortable_key(x)
            _append(live & (key >= t), key, idx, row, count_ptr, cand_key_ptr, cand_idx_ptr, CAP)
            idx += BLOCK
            x, live = x_next, live_next


@triton.jit
def _append(cand, key, idx, row, count_ptr, cand_key_ptr, cand_idx_ptr, CAP: tl.constexpr):
    """The tile's candidates (``cand``) appended to the row's buffer: one atomic per tile, ranks
    inside the tile by a scan; past CAP only counted (the row then takes the slow path)."""
    n = tl.sum(cand.to(tl.int32), 0)
    if n > 0:
        base = tl.atomic_add(count_ptr + row * COUNT_STRIDE, n, sem="relaxed")
        slot = base + tl.cumsum(cand.to(tl.int32), 0) - 1
        keep = cand & (slot < CAP)
        tl.store(cand_key_ptr + row * CAP + slot, key.to(tl.int32, bitcast=True), keep)
        tl.store(cand_idx_ptr + row * CAP + slot, idx, keep)


@triton.jit
def _compact_live(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    live_ptr,  # [R, M + SLACK] int32: the live segments (_threshold with LIST)
    nlive_ptr,  # [R] int32
    thresh_ptr,  # [R] int32
    count_ptr,  # [R, COUNT_STRIDE] int32: column 0
    cand_key_ptr,  # [R, CAP] int32
    cand_idx_ptr,  # [R, CAP] int32
    row_stride,
    L,
    k,
    M: tl.constexpr,
    SLACK: tl.constexpr,
    LEVELS: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    """_compact over the live segments' columns only: position q of the row's live space is
    column ``q mod 2**level`` of live segment ``q >> level``. Each tile is all live columns (a
    quarter of a 131072-column row in ~9 tiles of 4096, where _compact scans 128 tiles of
    1024), and no column gathers its segment's maximum."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    start, end = window(starts_ptr, ends_ptr, row, L)
    if end - start > k:
        level = _row_level(start, end, M, SLACK, LEVELS)
        first = (start >> level) << level  # segment 0's first column
        within = (1 << level) - 1
        t = tl.load(thresh_ptr + row).to(tl.uint32, bitcast=True)
        total = tl.load(nlive_ptr + row) << level
        row_ptr = logits_ptr + row * row_stride
        for lo in range(part * BLOCK, total, parts * BLOCK):
            q = lo + tl.arange(0, BLOCK)
            seg = tl.load(live_ptr + row * (M + SLACK) + (q >> level), mask=q < total, other=0)
            col = first + (seg << level) + (q & within)
            live = (q < total) & (col >= start) & (col < end)
            key = _sortable_key(tl.load(row_ptr + col, mask=live, other=0.0))
            _append(live & (key >= t), key, col, row, count_ptr, cand_key_ptr, cand_idx_ptr, CAP)


@triton.jit
def _inside(idx, start, hi):
    return (idx >= start) & (idx < hi)


@triton.jit
def _segment_maxima(max_row, idx, level, start, hi):
    """The maximum key of each column's segment (0 outside [start, hi): loads nothing)."""
    seg_max = tl.load(max_row + (idx >> level), mask=_inside(idx, start, hi), other=0)
    return seg_max.to(tl.uint32, bitcast=True)


# Per device, every counter buffer made (a captured graph keeps the pointer of the one it
# captured, so none is freed when a larger one replaces it).
_ARRIVALS: dict[torch.device, list[torch.Tensor]] = {}
_ARRIVAL_ROWS = 1024  # the fewest rows a counter buffer is made for


def _arrival_counters(device: torch.device, rows: int) -> torch.Tensor:
    """int32 [rows] zeros for _segment_max's FOLD, which leaves them zero: made once per device
    (and again for more rows), so that neither a call nor a graph's replay launches a memset."""
    made = _ARRIVALS.setdefault(device, [])
    if not made or made[-1].numel() < rows:
        made.append(torch.zeros(max(rows, _ARRIVAL_ROWS), dtype=torch.int32, device=device))
    return made[-1][:rows]


def _levels(length: int, segments: int) -> int:
    """Levels 0 .. LEVELS-1, the last one leaving at most ``segments`` over a whole row."""
    level = 0
    while ((length - 1) >> level) + 1 > segments:
        level += 1
    return level + 1


@dataclass(frozen=True)
class ThresholdTiles:
    """Launch parameters. The defaults: 8 warps hold an 8192-key register tile in 32 registers
    a thread (_threshold, select_candidates; _threshold's 128 tail maxima in one more);
    4096-column tiles give 16-byte loads, 4 per thread, in _segment_max; the compaction reads
    only the live segments' columns (_compact_live), in 1024-column tiles, ~8 programs per SM.
    H200 sweeps of bench/topk_gpu.py (2026-12-01): the live-segment compaction took 64 x 131072
    from 82.6 to 48.1 us and 64 x 32768 from 37.9 to 31.7; 1024-column tiles had beaten 2048
    (_compact: 87.9 against 116.1 us at 64 x 131072)."""

    # Segment maxima per row that vote for T (M, at least segments_per_k k; M/64 more, the
    # tail, are compacted only): more, fewer candidates.
    segments: int = 8192
    # The least M as a multiple of k: ~-m ln(1 - k/m) candidates, 2357 at 4k (k = 2048) and
    # 2839 at 2k, against a search over half the maxima in _threshold.
    segments_per_k: int = 4
    capacity: int = 8192  # candidate slots per row (CAP): a row with more takes the slow path
    block: int = 4096  # columns per tile of _segment_max
    compact_block: int = 1024  # columns per tile of _compact and of the slow path
    chunks: int | None = None  # _compact programs per row; None: ~8 per multiprocessor
    # Compact over the live segments' columns (a list _threshold writes; _compact_live), not
    # every column with a gather of its segment's maximum (_compact): fewer, fuller tiles.
    by_segment: bool = True
    # Search the k-th key two bits a round (three counts per reduction) instead of one: half
    # the reductions in _threshold and select_candidates. Not yet timed on a GPU (its first
    # H200 sweep hit a compile error the interpreter cannot see); in SWEEP_GRID.
    search_pairs: bool = False
    # Search the k-th key 8 bits a round, by a 256-bin histogram of the keys still matching
    # (kth_largest_radix): 2 rounds for T and at most 4 in select_candidates, against 16 and
    # 32 reductions bit by bit. Slower on the H200 (Triton 3.6, 2026-12-03): 64 x 32768 43.0
    # us against 31.0, 64 x 131072 64.6 against 48.7 (3.6's 256-bin histogram is ~100
    # instructions a key a round); kept in SWEEP_GRID for other Triton versions.
    # threshold_bits must be a multiple of radix_bits, and search_pairs off.
    radix_search: bool = False
    # Bits a histogram round of radix_search: 8 (256 bins), or 4 (16 bins: twice the rounds,
    # each histogram cheaper). Both slower than the bitwise search on the H200 (2026-12-03,
    # 64 x 32768): 4 bits 37.0 us, 8 bits 43.1, the default 28.7.
    radix_bits: int = 8
    # Stop the bitwise search at the first v with exactly k keys >= v (kth_largest_until_exact):
    # then the keys >= v are the k best, and the rounds that would narrow v down to the k-th
    # key are skipped. The one-bit search only (search_pairs and radix_search ignore it).
    # H200, 2026-12-03 (indexer-like rows): 64 x 32768 29.8 us against 30.8, 64 x 131072 45.2
    # against 48.2, 1 x 131072 23.3 against 26.5. (Passes 2 to 4 in one program per row, its
    # live-column scan serial, were slower in the same sweep: 36-48 us at 64 x 32768, 74-112
    # at 64 x 131072; removed.)
    early_exit: bool = True
    # T searched by _segment_max's last program of each row (an arrival count per row), not
    # by a _threshold launch after it: one launch boundary fewer (~0.7 us under PDL on the
    # H200), and a row's search starts as soon as its maxima are stored. The search then runs
    # at num_warps. Not yet timed; in SWEEP_GRID.
    fold_threshold: bool = False
    num_warps: int = 8  # _segment_max, _compact
    # ptxas's register cap for the compaction (None: none). Its sm_90 build holds 47 registers
    # a thread at 8 warps: 5 programs a multiprocessor, where the default chunks assume 8, so
    # 64 rows x 17 chunks run in 1.65 waves; at 32, 8 fit. H100, 2026-12-07 (whole call, us):
    # 64 x 131072 45.7 -> 44.7 at 40, 45.4 -> 45.2 at 32; 64 x 32782 37.4 -> 37.3 and 36.8 ->
    # 37.2. Within about 1 us either way: not the default.
    compact_registers: int | None = None
    select_warps: int = 8  # _threshold, select_candidates (one program per row)
    threshold_bits: int = 16  # top bits of T searched; fewer: a coarser (lower) T


# What bench/topk_gpu.py --sweep times: one parameter at a time around the defaults (chunks,
# per row count, the bench varies itself). 16384 candidates get 16 warps (at 8 the tile spills
# heavily; ptxas for sm_90 still puts 248 bytes on the stack at 16). Timed once on the H200
# (2026-12-01, 64-row shapes): compact_block 1024 won, then by_segment; both are defaults.
SWEEP_GRID: tuple[ThresholdTiles, ...] = tuple(
    replace(ThresholdTiles(), **change)
    for change in (
        # newest first (a sweep's time budget may cut the tail)
        {"compact_registers": 32},
        {"compact_registers": 40},
        {"compact_registers": 32, "compact_block": 2048},
        {"fold_threshold": True},
        # the folded search holds 105 registers a thread against the plain maxima's 58 (ptxas,
        # sm_90): 2 programs an SM, not 4; half the programs with 8192-column tiles; at 16
        # warps 83 registers (one program an SM, the same 16 warps)
        {"fold_threshold": True, "block": 8192},
        {"fold_threshold": True, "num_warps": 16},
        {"radix_search": True, "radix_bits": 4},
        {"radix_search": True, "radix_bits": 4, "capacity": 4096},
        {"radix_search": True, "radix_bits": 4, "select_warps": 4},
        {"early_exit": False},
        {"segments": 16384},
        {"segments": 32768, "select_warps": 16},
        {"capacity": 4096},
        {"capacity": 16384, "select_warps": 16},
        {"block": 2048},
        {"block": 8192},
        {"compact_block": 512},
        {"compact_block": 2048},
        {"by_segment": False},
        {"compact_block": 4096, "chunks": 4},
        {"by_segment": False, "search_pairs": True},
        {"search_pairs": True},
        {"radix_search": True},
        {"radix_search": True, "select_warps": 4},
        {"radix_search": True, "capacity": 4096},
        {"num_warps": 4},
        {"num_warps": 16},
        {"select_warps": 16},
        {"threshold_bits": 12},
        {"threshold_bits": 20},
    )
)


@dataclass(frozen=True)
class TopkKernels:
    """A vendor's kernels in place of _threshold and select_candidates (the NVIDIA plugin's
    Gluon ones), each called with the launch's arguments and returning whether it launched
    (False: the Triton kernel runs). Used only with the early-exit bitwise search, by_segment
    and no fold_threshold, the forms they implement.

    - ``threshold(rows, seg_max, outputs, L, k, M, slack, levels, bits)``: _threshold's
      outputs (thresh, counts zeroed, live, nlive) from the segment maxima (counts: [R,
      COUNT_STRIDE], column 0 each row's);
    - ``compact(logits, rows, live, nlive, thresh, counts, cand, L, k, M, slack, levels, cap,
      block, parts)``: _compact_live's candidates and counts (``parts`` programs a row), with
      by_segment;
    - ``select(logits, rows, thresh, counts, cand, out, L, k, cap, idx_bits, block,
      k_block)``: select_candidates' output."""

    threshold: Callable[..., bool] | None = None
    select: Callable[..., bool] | None = None
    compact: Callable[..., bool] | None = None


def _run(
    logits: torch.Tensor,  # [R, L] float32, unit column stride
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
    tiles: ThresholdTiles,
    kernels: TopkKernels | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [R, k] int32, candidates [R] int32
    """The four launches; ``kernels`` may put a vendor's in place of two (:class:`TopkKernels`)."""
    if tiles.search_pairs and tiles.threshold_bits % 2:
        raise ValueError(
            f"ThresholdTiles: search_pairs searches two bits a round; threshold_bits must be "
            f"even, got {tiles.threshold_bits}"
        )
    if tiles.radix_search and (
        tiles.radix_bits not in (4, 8)
        or tiles.search_pairs
        or tiles.threshold_bits % tiles.radix_bits
    ):
        raise ValueError(
            f"ThresholdTiles: radix_search searches radix_bits (4 or 8) a round, alone; it "
            f"needs threshold_bits a multiple of them and search_pairs off, got radix_bits="
            f"{tiles.radix_bits}, threshold_bits={tiles.threshold_bits}, search_pairs="
            f"{tiles.search_pairs}"
        )
    R, L = logits.shape
    device = logits.device
    out = torch.empty((R, k), dtype=torch.int32, device=device)
    # column 0: each row's candidates, zeroed by _threshold (COUNT_STRIDE: a line a row)
    counts = torch.empty((R, COUNT_STRIDE), dtype=torch.int32, device=device)
    if R == 0:
        return out, counts[:, 0]
    pow2, cdiv = triton.next_power_of_2, triton.cdiv
    width = max(L, 1)
    # At least 4k segments: a window's level then leaves it more than 2k (k/m < 1/2, at most
    # 1.39k candidates from independent scores); with m just above k, T would sit near the
    # bottom of the row. No more than the row's columns (level 0 then covers every window).
    M = min(max(pow2(tiles.segments), pow2(tiles.segments_per_k) * pow2(k)), pow2(width))
    # Up to M/64 segments past M at the finer level (the tail: compacted, not voting for T).
    # The engine's rows are just over a power of two (32782 columns: a 32K context and the
    # decoded tokens), 4 segments too many for level 2 at M = 8192: at level 3 they took
    # ~2840 candidates against ~2290 at 32768, and compaction and select 8.3 and 10.8 us a
    # layer against 5.2 and 8.7 (H200).
    slack = max(1, M // 64)
    levels = _levels(width, M + slack)
    seg_block = max(tiles.block, 1 << (levels - 1))  # a segment never straddles two tiles
    cap = max(2, min(pow2(tiles.capacity), pow2(width)))  # a row has at most L candidates
    block = tiles.compact_block
    chunks = tiles.chunks
    if chunks is None:
        sms = (
            torch.cuda.get_device_properties(device).multi_processor_count if logits.is_cuda else 1
        )
        chunks = cdiv(8 * sms, R)
    chunk = cdiv(cdiv(width, max(1, min(chunks, cdiv(width, block)))), block) * block
    seg_max = torch.empty((R, M + slack), dtype=torch.int32, device=device)
    thresh = torch.empty(R, dtype=torch.int32, device=device)
    cand = torch.empty((2, R, cap), dtype=torch.int32, device=device)
    rows = (starts.to(torch.int32), ends.to(torch.int32))  # clamped in the kernels
    stride = logits.stride(0)
    warps, select_warps = tiles.num_warps, tiles.select_warps
    early = tiles.early_exit and not (tiles.search_pairs or tiles.radix_search)
    search = (tiles.search_pairs, tiles.radix_search, early, tiles.radix_bits)
    idx_bits = max(1, (L - 1).bit_length())
    k_block = min(pow2(k), 4096)
    # With by_segment, the live segments' list and count (else unused: seg_max stands in).
    live, nlive = seg_max, thresh
    if tiles.by_segment:
        live = torch.empty((R, M + slack), dtype=torch.int32, device=device)
        nlive = torch.empty(R, dtype=torch.int32, device=device)
    outputs = (thresh, counts, live, nlive)
    search_args = (tiles.threshold_bits, tiles.by_segment, *search)
    fold = tiles.fold_threshold
    arrived = _arrival_counters(device, R) if fold else thresh  # unused without the fold
    prepare_launch()
    _segment_max[(R, cdiv(width, seg_block))](
        logits, *rows, seg_max, stride, L, k, *outputs, arrived, M, slack, levels, seg_block,
        fold, *search_args, num_warps=warps, **pdl_options(logits.device),
    )  # fmt: skip
    hooks = kernels or TopkKernels()
    # A vendor's search stands in only for the form it has: the early-exit bitwise one (for T
    # also with the live list, and not folded into _segment_max).
    plain = early and not fold and tiles.by_segment
    launched = False
    if plain and hooks.threshold is not None:
        bits = tiles.threshold_bits
        launched = hooks.threshold(rows, seg_max, outputs, L, k, M, slack, levels, bits)
    if not fold and not launched:
        _threshold[(R,)](
            *rows, seg_max, *outputs, L, k, M, slack, levels, *search_args,
            num_warps=select_warps, **pdl_options(logits.device),
        )  # fmt: skip
    registers = {}
    if tiles.compact_registers is not None and logits.is_cuda:  # a compile option
        registers = {"maxnreg": tiles.compact_registers}
    parts = max(1, min(chunks, cdiv(width, block)))
    compacted = tiles.by_segment and hooks.compact is not None and hooks.compact(
        logits, rows, live, nlive, thresh, counts, cand, L, k, M, slack, levels, cap, block, parts
    )
    if tiles.by_segment and not compacted:
        _compact_live[(R, parts)](
            logits, *rows, live, nlive, thresh, counts, cand[0], cand[1], stride, L, k, M,
            slack, levels, cap, block, num_warps=warps, **registers,
            **pdl_options(logits.device),
        )  # fmt: skip
    elif not tiles.by_segment:
        _compact[(R, cdiv(width, chunk))](
            logits, *rows, seg_max, thresh, counts, cand[0], cand[1], stride, L, k, chunk,
            M, slack, levels, cap, block, num_warps=warps, **pdl_options(logits.device),
        )  # fmt: skip
    selected = early and hooks.select is not None and hooks.select(
        logits, rows, thresh, counts, cand, out, L, k, cap, idx_bits, block, k_block
    )
    if not selected:
        select_candidates[(R,)](
            logits, *rows, thresh, counts, cand[0], cand[1], out, stride, L, k,
            cap, idx_bits, block, k_block, *search, num_warps=select_warps,
            **pdl_options(logits.device),
        )  # fmt: skip
    return out, counts[:, 0]


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
    tiles: ThresholdTiles = ThresholdTiles(),
    kernels: TopkKernels | None = None,
) -> torch.Tensor:  # [R, k] int32, indices relative to starts, -1 padded
    """Top-k positions of each row's window ``[starts[r], ends[r])`` of ``logits`` (any order).
    Scratch: R x (M + SLACK + 2 CAP) int32, with ``tiles.by_segment`` R x (M + SLACK) more
    (the live list). ``k > MAX_K`` runs the radix kernel. ``kernels``: vendor stand-ins."""
    logits = checked_args(logits, starts, ends, k)
    if k > MAX_K:
        return radix_topk(logits, starts, ends, k)
    return _run(logits, starts, ends, k, tiles, kernels)[0]


def candidate_counts(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
    tiles: ThresholdTiles = ThresholdTiles(),
) -> torch.Tensor:  # [R] int32, 0 for rows of at most k columns
    """Each row's candidates (keys >= T) in :func:`topk`; above ``tiles.capacity`` the row took
    the slow path. For benchmarks and tests."""
    if k > MAX_K:
        raise ValueError(f"k={k} > MAX_K={MAX_K} runs the radix kernel, which has no candidates")
    return _run(checked_args(logits, starts, ends, k), starts, ends, k, tiles)[1]
