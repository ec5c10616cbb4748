"""indexer.topk's Triton kernels (topk_threshold.py) with three of the four in Gluon: the two
one-program-a-row searches (``_threshold``, ``select_candidates``) and the compaction
(``_compact_live``), each writing what the Triton kernel writes (topk_threshold.TopkKernels).

The searches find a key bit by bit over thousands of keys held in one program's registers,
and each round's count must be summed across the program's 8 warps. Triton does that through
shared memory with three ``bar.sync`` (one before its scratch is written, one after each of two
stages); on an H100 a round cost ~0.32 us, and the rounds were over half of each kernel's time.
Here the layouts are written out so that a count is first summed inside each warp (one
``redux.sync``, no shared memory); each warp writes its count to a slot, and after one barrier
every thread reads the warps' counts and adds them itself. Two slots are taken in turn, so a
round's writes can only race the reads of the round before, which that round's barrier has
already ordered: one barrier a round. The select takes the Triton kernel's exact slow path
(four 8-bit histogram passes over the window) for a row whose candidates overflowed.

The compaction gives every warp its own share of the tile: its count, its atomic reserving the
slots, its ranks by a scan inside the warp. Triton's waits on the whole program three times a
tile (the count's reduction, the atomic's broadcast, the ranks' scan). Its 8x more atomics
made it slower (16.5 us against 13.0 at 64 x 131072) until each row's counter got a 128-byte
line of its own (topk_select.COUNT_STRIDE): 7.5 us.

On an H100 (2026-12-07, docs/benchmarks.md; torch.topk 163.2 us) the three took the top-k of
64 x 131072 from 44.3 to 34.1 us (0.21x torch.topk), 1 x 131072 from 23.6 to 18.3, 64 x 32782
from 36.8 to 30.9. Tested against the Triton kernels' outputs and the reference on a GPU
(plugins/nvidia/tests/test_gluon_topk_gpu.py, 8 passed there), the sm_90 builds read in CI
(plugins/nvidia/tests/test_gluon_topk.py).
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from hwrun.kernels.triton.pdl import pdl_options
from hwrun.kernels.triton.topk_select import COUNT_STRIDE
from hwrun_nvidia.gluon_paged_logits import _cta_barrier

WARPS = 8  # one program a row: 8192 keys are 32 registers a thread
COLUMNS = gl.constexpr(128)  # keys a warp row: 4 a thread, one 16-byte load
SLOT_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
MIN_KEYS = 128 * WARPS  # the fewest keys a tile holds: one warp row a warp


@triton.constexpr_function
def _tile_layout(W):
    # [W, rows, COLUMNS]: warp w holds rows w * rows .. (w + 1) * rows - 1 of the keys
    return gl.BlockedLayout([1, 1, 4], [1, 1, 32], [int(W), 1, 1], [2, 1, 0])


@triton.constexpr_function
def _every_warp(W):
    # [W, n <= W]: the W warps' values (dim 0) in every thread's registers; dim 1 over the
    # warps (n = 1: the same in every warp)
    return gl.BlockedLayout([int(W), 1], [32, 1], [1, int(W)], [0, 1])


@triton.constexpr_function
def _row_layout(W):
    # one dimension over the program, for the short rows' and the slow path's tiles
    return gl.BlockedLayout([1], [32], [int(W)], [0])


@gluon.jit
def _tile_positions(TILE: gl.constexpr, W: gl.constexpr):
    """[W, TILE / (COLUMNS W), COLUMNS] int32: each element's position in the tile (lane
    order; 4 consecutive positions a thread, so loads are 16 bytes)."""
    layout: gl.constexpr = _tile_layout(W)
    ROWS: gl.constexpr = TILE // (COLUMNS * W)
    warp = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    cols = gl.arange(0, COLUMNS, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    at = gl.expand_dims(gl.expand_dims(warp * ROWS, 1) + gl.expand_dims(rows, 0), 2)
    return at * COLUMNS + gl.expand_dims(gl.expand_dims(cols, 0), 1)


@gluon.jit
def _per_warp(x):
    """Each warp's sum over its part of a [W, r, COLUMNS] tensor, [W, 1] (in-thread first:
    one redux.sync)."""
    return gl.expand_dims(gl.sum(gl.sum(x, axis=1), axis=1), 1)


@gluon.jit
def _from_every_warp(slot, W: gl.constexpr):
    """A slot's [W, 1] values, one a warp, in every thread (the compiler puts a barrier before
    this load, after the warps' stores)."""
    return slot.load(_every_warp(W))


@gluon.jit
def _summed(x, slot, W: gl.constexpr):
    """The sum of an int32 [W, r, COLUMNS] tensor over the program, in every thread."""
    slot.store(_per_warp(x))
    return gl.sum(gl.sum(_from_every_warp(slot, W), axis=1), axis=0)


@gluon.jit
def _largest(keys, W: gl.constexpr):
    """The largest of a uint32 [W, r, COLUMNS] tensor over the program (one barrier)."""
    slot = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    part = gl.max(gl.max(keys, axis=1), axis=1).to(gl.int32, bitcast=True)
    slot.store(gl.expand_dims(part, 1))
    every = _from_every_warp(slot, W).to(gl.uint32, bitcast=True)
    return gl.max(gl.max(every, axis=1), axis=0)


@gluon.jit
def _smallest_and_largest(keys, inside, W: gl.constexpr):
    """The smallest of a uint32 [W, r, COLUMNS] tensor where ``inside``, and its largest, over
    the program (one barrier for both)."""
    low = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    high = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    part = gl.min(gl.min(gl.where(inside, keys, 0xFFFFFFFF), axis=1), axis=1)
    low.store(gl.expand_dims(part.to(gl.int32, bitcast=True), 1))
    part = gl.max(gl.max(keys, axis=1), axis=1)
    high.store(gl.expand_dims(part.to(gl.int32, bitcast=True), 1))
    lo = gl.min(gl.min(_from_every_warp(low, W).to(gl.uint32, bitcast=True), axis=1), axis=0)
    hi = gl.max(gl.max(_from_every_warp(high, W).to(gl.uint32, bitcast=True), axis=1), axis=0)
    return lo, hi


@gluon.jit
def _round(keys, v, count, k, i, active, slot, W: gl.constexpr):
    """One round of the bitwise search: bit 31 - i tried on top of v, counted over the keys,
    taken where at least k keys reach it (and ``active``)."""
    trial = v | (gl.full((), 1, gl.uint32) << (31 - gl.minimum(i, 31)).to(gl.uint32))
    c = _summed((keys >= trial).to(gl.int32), slot, W)
    take = active & (c >= k)
    return gl.where(take, trial, v), gl.where(take, c, count)


@gluon.jit
def _kth_largest_until_exact(keys, k, lo, hi, BITS: gl.constexpr, W: gl.constexpr):
    """topk_select.kth_largest_until_exact over a [W, r, COLUMNS] uint32 tile: the largest v
    (zero below its top BITS bits) with at least k keys >= v, stopping at the first v with
    exactly k; lo <= v <= hi, their shared leading bits copied. Returns (v, count), count the
    keys >= v where a trial was taken (-1 where none was)."""
    diff = lo ^ hi
    one = gl.full((), 1, gl.uint32)
    v = gl.zeros((), gl.uint32)
    first = gl.zeros((), gl.int32)
    for i in gl.static_range(BITS):
        same = (diff >> (31 - i)) == 0
        v = gl.where(same, v | (lo & (one << (31 - i))), v)
        first = gl.where(same, i + 1, first)
    count = gl.full((), -1, gl.int32)
    _cta_barrier()  # every slot read before: the rounds' slots may reuse their memory
    even = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    odd = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    i = first
    # Two rounds an iteration, one a slot. The second always runs (its barrier must, for the
    # next iteration's first round), applied only while the search goes on.
    while (i < BITS) & (count != k):
        v, count = _round(keys, v, count, k, i, i < BITS, even, W)
        i += 1
        v, count = _round(keys, v, count, k, i, (i < BITS) & (count != k), odd, W)
        i += 1
    return v, count


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _ranks(flags, W: gl.constexpr):
    """Each flagged element's rank among the flagged ones of a [W, r, COLUMNS] int32 (0 / 1)
    tile, in position order (valid where flagged), and their count: from the warps' counts
    before its warp (one barrier), its warp's rows before its row, and its row up to it."""
    in_row = gl.associative_scan(flags, 2, _add)
    row_total = gl.sum(flags, axis=2)
    ROWS: gl.constexpr = flags.shape[1]
    # a scan takes a blocked layout: the same registers, named as one
    rows_layout: gl.constexpr = gl.BlockedLayout([1, ROWS], [1, 32], [W, 1], [1, 0])
    blocked = gl.convert_layout(row_total, rows_layout, assert_trivial=True)
    before_row = gl.associative_scan(blocked, 1, _add) - blocked
    before_row = gl.convert_layout(before_row, row_total.type.layout, assert_trivial=True)
    slot = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    slot.store(gl.expand_dims(gl.sum(row_total, axis=1), 1))
    every = _from_every_warp(slot, W)  # [W, 1]
    pair: gl.constexpr = _every_warp(W)
    other = gl.arange(0, W, layout=gl.SliceLayout(1, pair))
    me = gl.arange(0, W, layout=gl.SliceLayout(0, pair))  # this thread's warp
    before = gl.where(gl.expand_dims(other, 1) < gl.expand_dims(me, 0), every, 0)  # [W, W]
    layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, flags.type.layout))
    before_warp = gl.convert_layout(gl.sum(before, axis=0), layout, assert_trivial=True)
    rank = gl.expand_dims(gl.expand_dims(before_warp, 1) + before_row, 2) + in_row - 1
    return rank, gl.sum(gl.sum(every, axis=1), axis=0)


@gluon.jit
def _window(starts_ptr, ends_ptr, row, L):
    """topk_select.window: the row's window clamped to [0, L]."""
    start = gl.minimum(gl.maximum(gl.load(starts_ptr + row), 0), L)
    end = gl.maximum(gl.minimum(gl.maximum(gl.load(ends_ptr + row), 0), L), start)
    return start, end


@gluon.jit
def _row_level(start, end, M: gl.constexpr, SLACK: gl.constexpr, LEVELS: gl.constexpr):
    """topk_threshold._row_level: the smallest level whose aligned segments of 2**level
    columns cover [start, end) with at most M + SLACK of them."""
    level = start * 0
    for lvl in gl.static_range(LEVELS - 1):
        level += ((((end - 1) >> lvl) - (start >> lvl) + 1) > M + SLACK).to(gl.int32)
    return level


@gluon.jit
def _threshold_kernel(
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    max_ptr,  # [R, M + SLACK] int32: uint32 keys
    thresh_ptr,  # [R] int32: uint32 key T
    count_ptr,  # [R, COUNT_STRIDE] int32: column 0 zeroed here for the compaction
    live_ptr,  # [R, M + SLACK] int32: the segments whose maximum reaches T, in order
    nlive_ptr,  # [R] int32: how many
    L,
    k,
    M: gl.constexpr,
    SLACK: gl.constexpr,
    LEVELS: gl.constexpr,
    BITS: gl.constexpr,
    PDL: gl.constexpr = False,  # hwrun.kernels.triton.pdl's protocol
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    W: gl.constexpr = gl.num_warps()
    row = gl.program_id(0).to(gl.int64)
    start, end = _window(starts_ptr, ends_ptr, row, L)
    gl.store(count_ptr + row * COUNT_STRIDE, 0)
    if end - start > k:
        level = _row_level(start, end, M, SLACK, LEVELS)
        nseg = ((end - 1) >> level) - (start >> level) + 1
        seg = _tile_positions(M, W)
        max_row = max_ptr + row * (M + SLACK)
        inside = seg < nseg
        seg_max = gl.load(max_row + seg, cache_modifier=".cg").to(gl.uint32, bitcast=True)
        seg_max = gl.where(inside, seg_max, 0)
        # T from the head's maxima, between their smallest and largest
        lo, hi = _smallest_and_largest(seg_max, inside, W)
        v, _ = _kth_largest_until_exact(seg_max, k, lo, hi, BITS, W)
        gl.store(thresh_ptr + row, v.to(gl.int32, bitcast=True))
        live = (inside & (seg_max >= v)).to(gl.int32)
        rank, nlive = _ranks(live, W)
        live_row = live_ptr + row * (M + SLACK)
        gl.store(live_row + rank, seg, mask=live != 0)
        if nseg > M:  # the tail's live segments after the head's
            # every warp the whole tail: its scan and sum stay inside the warp
            tail_layout: gl.constexpr = gl.BlockedLayout([SLACK // 32], [32], [W], [0])
            tail = M + gl.arange(0, SLACK, layout=tail_layout)
            tail_max = gl.load(max_row + tail, cache_modifier=".cg").to(gl.uint32, bitcast=True)
            tail_live = ((tail < nseg) & (tail_max >= v)).to(gl.int32)
            tail_rank = nlive + gl.associative_scan(tail_live, 0, _add) - 1
            gl.store(live_row + tail_rank, tail, mask=tail_live != 0)
            nlive += gl.sum(tail_live, axis=0)
        gl.store(nlive_ptr + row, nlive)


@gluon.jit
def _nth_smallest(idx, chosen, n, IDX_BITS: gl.constexpr, W: gl.constexpr):
    """topk_select._nth_smallest: the n-th smallest of the distinct ``idx`` where ``chosen``,
    one barrier a round (two slots in turn)."""
    _cta_barrier()  # every slot read before
    even = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    odd = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
    v = gl.zeros((), gl.int32)
    for i in gl.static_range(IDX_BITS):
        trial = v | (1 << (IDX_BITS - 1 - i))
        if i % 2 == 0:
            below = _summed((chosen & (idx < trial)).to(gl.int32), even, W)
        else:
            below = _summed((chosen & (idx < trial)).to(gl.int32), odd, W)
        v = gl.where(below < n, trial, v)
    return v


@gluon.jit
def _select_tile(key_row, idx_row, out_row, n, k, t, start, TILE: gl.constexpr,
                 IDX_BITS: gl.constexpr, W: gl.constexpr):  # fmt: skip
    """topk_select._select_tile (the early-exit search): the k best of n <= TILE candidates."""
    lane = _tile_positions(TILE, W)
    valid = lane < n
    # Unmasked (vector) loads of the allocated [CAP] row; empty lanes get key 0, below every
    # real key (the key of -inf is 0x007FFFFF).
    key = gl.load(key_row + lane).to(gl.uint32, bitcast=True)
    key = gl.where(valid, key, 0)
    idx = gl.load(idx_row + lane)
    kth, count = _kth_largest_until_exact(key, k, t, _largest(key, W), 32, W)
    above = key > kth
    tie = key == kth
    cut = gl.full((), 0x7FFFFFFF, gl.int32)  # every tie
    if count != k:  # the keys >= kth are more than k: the ties at kth go by smallest index
        _cta_barrier()  # the search's slots read: these may reuse them
        above_slot = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
        tie_slot = gl.allocate_shared_memory(gl.int32, [W, 1], SLOT_SMEM)
        above_slot.store(_per_warp(above.to(gl.int32)))
        tie_slot.store(_per_warp(tie.to(gl.int32)))
        need = k - gl.sum(gl.sum(_from_every_warp(above_slot, W), axis=1), axis=0)
        ties = gl.sum(gl.sum(_from_every_warp(tie_slot, W), axis=1), axis=0)
        if ties > need:
            cut = _nth_smallest(idx, tie, need, IDX_BITS, W)
    take = above | (tie & (idx <= cut))
    rank, _ = _ranks(take.to(gl.int32), W)
    gl.store(out_row + rank, idx - start, mask=take)


@gluon.jit
def _radix_select_row(row_ptr, out_row, start, end, L, k, t, BLOCK: gl.constexpr,
                      W: gl.constexpr):  # fmt: skip
    """topk.radix_select_row, the slow path: four 8-bit histogram passes over the window narrow
    the k-th key among keys >= t, then one ordered sweep writes the winners, ties by smallest
    index."""
    layout: gl.constexpr = _row_layout(W)
    offs = gl.arange(0, BLOCK, layout=layout)
    bins = gl.arange(0, 256, layout=layout)
    first = (start // BLOCK) * BLOCK
    prefix = gl.zeros((), gl.uint32)
    hmask = gl.zeros((), gl.uint32)
    remaining = k + start * 0
    for p in gl.static_range(4):
        hist = gl.zeros((256,), gl.int32, layout)
        for o in range(first, end, BLOCK):
            idx = gl.multiple_of(o, 16) + offs
            key = _sortable_key(gl.load(row_ptr + idx, mask=idx < L, other=0.0))
            match = (idx >= start) & (idx < end) & (key >= t) & ((key & hmask) == prefix)
            digit = ((key >> (24 - 8 * p)) & 255).to(gl.int32)
            hist += gl.histogram(digit, 256, mask=match, layout=layout)
        total = gl.sum(hist, 0)
        higher = total - gl.associative_scan(hist, 0, _add)  # keys in higher bins
        chosen = gl.sum((higher + hist >= remaining).to(gl.int32), 0) - 1
        remaining -= gl.sum(gl.where(bins == chosen, higher, 0), 0)
        prefix = prefix | (chosen.to(gl.uint32) << (24 - 8 * p))
        hmask = hmask | (gl.full((), 255, gl.uint32) << (24 - 8 * p))
    taken = start * 0
    ties = start * 0
    for o in range(first, end, BLOCK):
        idx = gl.multiple_of(o, 16) + offs
        key = _sortable_key(gl.load(row_ptr + idx, mask=idx < L, other=0.0))
        inside = (idx >= start) & (idx < end)
        tie = inside & (key == prefix)
        tie_rank = ties + gl.associative_scan(tie.to(gl.int32), 0, _add) - 1
        take = (inside & (key > prefix)) | (tie & (tie_rank < remaining))
        slot = taken + gl.associative_scan(take.to(gl.int32), 0, _add) - 1
        gl.store(out_row + slot, idx - start, mask=take)
        taken += gl.sum(take.to(gl.int32), 0)
        ties += gl.sum(tie.to(gl.int32), 0)


@gluon.jit
def _sortable_key(x):
    """topk._sortable_key: float32 as an order-preserving uint32 (NaN as -inf, -0.0 as +0.0)."""
    x = gl.where(x != x, float("-inf"), x)
    x = gl.where(x == 0.0, 0.0, x)
    u = x.to(gl.uint32, bitcast=True)
    return gl.where((u >> 31) == 1, u ^ 0xFFFFFFFF, u | 0x80000000)


@gluon.jit
def _select_kernel(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    thresh_ptr,  # [R] int32
    count_ptr,  # [R, COUNT_STRIDE] int32: column 0
    cand_key_ptr,  # [R, CAP] int32
    cand_idx_ptr,  # [R, CAP] int32
    out_ptr,  # [R, k] int32
    row_stride,
    L,
    k,
    CAP: gl.constexpr,
    IDX_BITS: gl.constexpr,
    BLOCK: gl.constexpr,
    K_BLOCK: gl.constexpr,
    PDL: gl.constexpr = False,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    W: gl.constexpr = gl.num_warps()
    row = gl.program_id(0).to(gl.int64)
    start, end = _window(starts_ptr, ends_ptr, row, L)
    out_row = out_ptr + row * k
    if end - start <= k:
        # Short row: every position, in order, then -1 padding (the reference's rule).
        for o in range(0, k, K_BLOCK):
            ko = o + gl.arange(0, K_BLOCK, layout=_row_layout(W))
            gl.store(out_row + ko, gl.where(ko < end - start, ko, -1), mask=ko < k)
    else:
        n = gl.load(count_ptr + row * COUNT_STRIDE)
        t = gl.load(thresh_ptr + row).to(gl.uint32, bitcast=True)
        key_row = cand_key_ptr + row * CAP
        idx_row = cand_idx_ptr + row * CAP
        # Half a tile when the candidates fit: the search's work is per lane, used or not.
        if n <= CAP // 2:
            _select_tile(key_row, idx_row, out_row, n, k, t, start, CAP // 2, IDX_BITS, W)
        elif n <= CAP:
            _select_tile(key_row, idx_row, out_row, n, k, t, start, CAP, IDX_BITS, W)
        else:
            row_ptr = logits_ptr + row * row_stride
            _radix_select_row(row_ptr, out_row, start, end, L, k, t, BLOCK, W)


@gluon.jit
def _compact_kernel(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    live_ptr,  # [R, M + SLACK] int32: the live segments (the threshold's list)
    nlive_ptr,  # [R] int32
    thresh_ptr,  # [R] int32
    count_ptr,  # [R, COUNT_STRIDE] int32: column 0 the row's candidates
    cand_key_ptr,  # [R, CAP] int32
    cand_idx_ptr,  # [R, CAP] int32
    row_stride,
    L,
    k,
    M: gl.constexpr,
    SLACK: gl.constexpr,
    LEVELS: gl.constexpr,
    CAP: gl.constexpr,
    BLOCK: gl.constexpr,
    PDL: gl.constexpr = False,
):
    """topk_threshold._compact_live with every warp on its own: a warp takes BLOCK / W
    consecutive live positions of the program's tile, counts its candidates (one redux),
    reserves their slots with its own atomic and ranks them by a scan inside the warp, so no
    step waits on the program's other warps (Triton's takes 6 barriers a tile: the count's
    reduction, the atomic's broadcast, the rank's scan)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    W: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [W, 1], [1, 0])
    PER_WARP: gl.constexpr = BLOCK // W
    row = gl.program_id(0).to(gl.int64)
    part = gl.program_id(1)
    parts = gl.num_programs(1)
    start, end = _window(starts_ptr, ends_ptr, row, L)
    if end - start > k:
        level = _row_level(start, end, M, SLACK, LEVELS)
        first = (start >> level) << level  # segment 0's first column
        within = (1 << level) - 1
        t = gl.load(thresh_ptr + row).to(gl.uint32, bitcast=True)
        total = gl.load(nlive_ptr + row) << level
        row_ptr = logits_ptr + row * row_stride
        live_row = live_ptr + row * (M + SLACK)
        warp = gl.arange(0, W, layout=gl.SliceLayout(1, layout))
        lanes = gl.arange(0, PER_WARP, layout=gl.SliceLayout(0, layout))
        at = gl.expand_dims(warp * PER_WARP, 1) + gl.expand_dims(lanes, 0)  # [W, PER_WARP]
        # one atomic a warp: the element of each warp's first lane (one thread each)
        lane_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [W, 1], [1, 0])
        lane = gl.arange(0, 32, layout=gl.SliceLayout(0, lane_layout))
        first_lane = gl.expand_dims(lane == 0, 0)  # [1, 32]
        for lo in range(part * BLOCK, total, parts * BLOCK):
            q = lo + at
            seg = gl.load(live_row + (q >> level), mask=q < total, other=0)
            col = first + (seg << level) + (q & within)
            live = (q < total) & (col >= start) & (col < end)
            key = _sortable_key(gl.load(row_ptr + col, mask=live, other=0.0))
            cand = (live & (key >= t)).to(gl.int32)
            n = gl.sum(cand, axis=1)  # [W]: each warp's candidates
            n = gl.convert_layout(gl.expand_dims(n, 1), lane_layout, assert_trivial=True)
            n = n + gl.zeros_like(first_lane.to(gl.int32))  # [W, 32]
            reserve = first_lane & (n > 0)
            counter = count_ptr + row * COUNT_STRIDE + n * 0
            base = gl.atomic_add(counter, n, mask=reserve, sem="relaxed")
            base = gl.sum(gl.where(reserve, base, 0), axis=1)  # to every lane of the warp
            base = gl.convert_layout(gl.expand_dims(base, 1), layout, assert_trivial=True)
            slot = base + gl.associative_scan(cand, 1, _add) - 1
            keep = (cand != 0) & (slot < CAP)
            gl.store(cand_key_ptr + row * CAP + slot, key.to(gl.int32, bitcast=True), mask=keep)
            gl.store(cand_idx_ptr + row * CAP + slot, col, mask=keep)


def threshold(rows, seg_max, outputs, L: int, k: int, M: int, slack: int, levels: int,
              bits: int) -> bool:  # fmt: skip
    """topk_threshold._run's ``threshold`` hook: launches the Gluon search in _threshold's
    place where it fits (M a multiple of MIN_KEYS, 32 or more tail segments) and says so."""
    if M % MIN_KEYS or slack < 32:
        return False
    _threshold_kernel[(seg_max.shape[0],)](
        *rows, seg_max, *outputs, L, k, M, slack, levels, bits, num_warps=WARPS,
        **pdl_options(seg_max.device),
    )  # fmt: skip
    return True


def compact(logits, rows, live, nlive, thresh, counts, cand, L: int, k: int, M: int, slack: int,
            levels: int, cap: int, block: int, parts: int) -> bool:  # fmt: skip
    """topk_threshold._run's ``compact`` hook: the Gluon compaction in _compact_live's place
    (``parts`` programs a row) where each warp's share is whole 128-position rows."""
    if block % MIN_KEYS:
        return False
    _compact_kernel[(logits.shape[0], parts)](
        logits, *rows, live, nlive, thresh, counts, cand[0], cand[1], logits.stride(0), L, k,
        M, slack, levels, cap, block, num_warps=WARPS, **pdl_options(logits.device),
    )  # fmt: skip
    return True


def select(logits, rows, thresh, counts, cand, out, L: int, k: int, cap: int, idx_bits: int,
           block: int, k_block: int) -> bool:  # fmt: skip
    """topk_threshold._run's ``select`` hook: the Gluon select in select_candidates' place
    where its half tile holds whole warp rows (CAP >= 2 MIN_KEYS), and says so."""
    if cap < 2 * MIN_KEYS:
        return False
    _select_kernel[(logits.shape[0],)](
        logits, *rows, thresh, counts, cand[0], cand[1], out, logits.stride(0), L, k, cap,
        idx_bits, block, k_block, num_warps=WARPS, **pdl_options(logits.device),
    )  # fmt: skip
    return True
