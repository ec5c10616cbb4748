"""indexer.topk's exact selection (topk_threshold.py's passes 2 and 4): a row's clamped window,
the search for the k-th largest key over keys held in registers (bit by bit, two bits a round,
or four or eight bits a round by histograms), and the select program that picks a row's k best among
its candidates (ties at the k-th key by smallest index), or hands a row whose candidates
overflowed to the radix kernel's exact per-row path.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hwrun.kernels.triton.pdl import wait_for_previous_kernel
from hwrun.kernels.triton.topk import radix_select_row

# int32s between two rows' candidate counters: one 128-byte line each. Every program (or, in the
# NVIDIA plugin's Gluon compaction, every warp) of the compaction adds to its row's counter;
# packed, 64 rows' counters sat in two lines, and atomics to one line are served one after
# another. H100, 64 x 131072: the Gluon compaction 16.5 -> 7.5 us; Triton's 13.0 either way.
COUNT_STRIDE = tl.constexpr(32)


@triton.jit
def window(starts_ptr, ends_ptr, row, L):
    """Row ``row``'s window ``[start, end)`` clamped to ``[0, L]`` (``end >= start``): done here,
    not by the host, which took four small torch kernels per call (a decode step calls this op
    once per layer)."""
    start = tl.minimum(tl.maximum(tl.load(starts_ptr + row), 0), L)
    end = tl.maximum(tl.minimum(tl.maximum(tl.load(ends_ptr + row), 0), L), start)
    return start, end


@triton.jit
def kth_largest(keys, k, lo, hi, BITS: tl.constexpr, PAIRS: tl.constexpr):
    """The largest v (zero below its top BITS bits) with at least k keys >= v, given
    lo <= v <= hi: the bits above lo's and hi's first difference are copied, not searched.
    With PAIRS, two bits a round: three counts in one reduction (half the rounds, each of
    whose cost is mostly the reduction's latency across warps), else one bit a round."""
    diff = lo ^ hi
    v = tl.zeros((), tl.uint32)
    if PAIRS:
        tl.static_assert(BITS % 2 == 0, "two bits a round need an even BITS")
        for i in tl.static_range(BITS // 2):
            shift = 30 - 2 * i  # constexpr already (i is); annotated, it would be redefined
            # uint32 masks (an untyped 3 << 30 would not fit an int32 and widen v to int64)
            if (diff >> shift) == 0:
                v = v | (lo & (tl.full((), 3, tl.uint32) << shift))
            else:
                t1 = v | (tl.full((), 1, tl.uint32) << shift)
                t2 = v | (tl.full((), 2, tl.uint32) << shift)
                t3 = v | (tl.full((), 3, tl.uint32) << shift)
                c1, c2, c3 = tl.reduce(
                    (
                        (keys >= t1).to(tl.int32),
                        (keys >= t2).to(tl.int32),
                        (keys >= t3).to(tl.int32),
                    ),
                    0,
                    _add3,
                )
                v = tl.where(c3 >= k, t3, tl.where(c2 >= k, t2, tl.where(c1 >= k, t1, v)))
    else:
        for i in tl.static_range(BITS):
            bit = tl.full((), 1, tl.uint32) << (31 - i)
            if (diff >> (31 - i)) == 0:
                v = v | (lo & bit)
            else:
                trial = v | bit
                v = tl.where(tl.sum((keys >= trial).to(tl.int32), 0) >= k, trial, v)
    return v


@triton.jit
def kth_largest_until_exact(keys, k, lo, hi, BITS: tl.constexpr):
    """kth_largest's bitwise search (one bit a round) that stops at the first v with exactly
    k keys >= v: those k keys are then the top k whatever v's lower bits are, so the rounds
    that would only narrow v between the k-th and the (k+1)-th key are skipped (about half of
    them over a few thousand distinct candidates). Returns (v, exact): without ``exact`` v is
    kth_largest's (all BITS searched, or the bits copied from lo where lo and hi agree)."""
    diff = lo ^ hi
    one = tl.full((), 1, tl.uint32)
    v = tl.zeros((), tl.uint32)
    first = tl.zeros((), tl.int32)  # the leading bits lo and hi share, copied from lo
    for i in tl.static_range(BITS):
        same = (diff >> (31 - i)) == 0
        v = tl.where(same, v | (lo & (one << (31 - i))), v)
        first = tl.where(same, i + 1, first)
    count = tl.full((), -1, tl.int32)  # the keys >= v, known once a trial is taken
    i = first
    while (i < BITS) & (count != k):
        trial = v | (one << (31 - i).to(tl.uint32))
        c = tl.sum((keys >= trial).to(tl.int32), 0)
        v = tl.where(c >= k, trial, v)
        count = tl.where(c >= k, c, count)
        i += 1
    return v, count == k


@triton.jit
def _add3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def kth_largest_radix(keys, k, lo, hi, BITS: tl.constexpr, DIGIT: tl.constexpr):
    """kth_largest's v (the largest v, zero below its top BITS bits, with at least k keys >= v)
    in rounds of DIGIT bits (4 or 8), each a 2**DIGIT-bin histogram of the next digit of the
    keys that match v so far: BITS // DIGIT rounds of three steps across warps (histogram,
    scan, reduction) where the bitwise search takes BITS reductions. Given lo <= v and no key
    above hi (their maximum, or all ones): a round whose bits, and every bit above them, are the
    same in lo and hi copies them from lo, not searched; the last round is always searched, for
    its counts: ``need``, k less the keys whose top BITS bits are above v's, and ``ties``, the
    keys whose top BITS bits are v's (1 <= need <= ties; with BITS 32, the keys > v and == v).
    Returns (v, need, ties)."""
    tl.static_assert(BITS % DIGIT == 0 and BITS > 0 and BITS <= 32, "1 to 32 // DIGIT whole rounds")
    diff = lo ^ hi
    v = tl.zeros((), tl.uint32)
    # A tensor from the start: a round that copies must leave it the type a searched one gives.
    need = tl.zeros((), tl.int32) + k
    for r in tl.static_range(BITS // DIGIT - 1):
        if (diff >> (32 - DIGIT * (r + 1))) == 0:
            digit_mask = tl.full((), (1 << DIGIT) - 1, tl.uint32) << (32 - DIGIT * (r + 1))
            v = v | (lo & digit_mask)
        else:
            v, need, _ = _radix_round(keys, v, need, 32 - DIGIT * (r + 1), DIGIT)
    return _radix_round(keys, v, need, 32 - BITS, DIGIT)


@triton.jit
def _radix_round(keys, v, need, SHIFT: tl.constexpr, DIGIT: tl.constexpr):
    """The DIGIT-bit digit at SHIFT of the need-th largest key among those matching v above
    SHIFT, put into v; need less the matching keys in higher digits; the matching keys at the
    digit."""
    digit = ((keys >> SHIFT) & ((1 << DIGIT) - 1)).to(tl.int32)
    if SHIFT + DIGIT == 32:
        hist = tl.histogram(digit, 1 << DIGIT)
    else:
        hist = tl.histogram(digit, 1 << DIGIT, mask=((keys ^ v) >> (SHIFT + DIGIT)) == 0)
    at_or_above = tl.cumsum(hist, 0, reverse=True)  # matching keys in this digit or higher
    # Digits 0 .. d reach need (at_or_above falls as d rises): d is their count less one, and
    # the largest at_or_above short of need is the count above d (0 when d is the last digit).
    reach = at_or_above >= need
    reaching, above, at_or_above_d = tl.reduce(
        (
            reach.to(tl.int32),
            tl.where(reach, 0, at_or_above),
            tl.where(reach, at_or_above, 0x7FFFFFFF),
        ),
        0,
        _fold_digits,
    )
    v = v | ((reaching - 1).to(tl.uint32) << SHIFT)
    return v, need - above, at_or_above_d - above


@triton.jit
def _fold_digits(reach0, above0, at0, reach1, above1, at1):
    return reach0 + reach1, tl.maximum(above0, above1), tl.minimum(at0, at1)


@triton.jit
def _nth_smallest(idx, chosen, n, IDX_BITS: tl.constexpr):
    """The n-th smallest of the distinct ``idx`` where ``chosen`` (1 <= n <= their count)."""
    v = tl.zeros((), tl.int32)
    for i in tl.static_range(IDX_BITS):
        trial = v | (1 << (IDX_BITS - 1 - i))
        below = tl.sum((chosen & (idx < trial)).to(tl.int32), 0)
        v = tl.where(below < n, trial, v)
    return v


@triton.jit
def _select_tile(
    key_row,
    idx_row,
    out_row,
    n,
    k,
    t,
    start,
    TILE: tl.constexpr,
    IDX_BITS: tl.constexpr,
    PAIRS: tl.constexpr,
    RADIX: tl.constexpr,
    EARLY: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """The k best of n <= TILE candidates, all in registers."""
    lane = tl.arange(0, TILE)
    valid = lane < n
    # Unmasked (vector) loads of the allocated [CAP] row; empty lanes get key 0, below every
    # real key (the key of -inf is 0x007FFFFF).
    key = tl.load(key_row + lane).to(tl.uint32, bitcast=True)
    key = tl.where(valid, key, tl.zeros_like(key))
    idx = tl.load(idx_row + lane)
    if RADIX:
        # The last histogram's counts stand in for two more reductions.
        kth, need, ties = kth_largest_radix(key, k, t, tl.max(key, 0), 32, RADIX_BITS)
    elif EARLY:
        kth, exact = kth_largest_until_exact(key, k, t, tl.max(key, 0), 32)
        # exact: the keys >= kth are the k best; every tie at kth is taken (need == ties)
        need = tl.zeros((), tl.int32)
        ties = tl.zeros((), tl.int32)
        if exact == 0:
            need = k - tl.sum((key > kth).to(tl.int32), 0)
            ties = tl.sum((key == kth).to(tl.int32), 0)
    else:
        kth = kth_largest(key, k, t, tl.max(key, 0), 32, PAIRS)
        need = k - tl.sum((key > kth).to(tl.int32), 0)
        ties = tl.sum((key == kth).to(tl.int32), 0)
    above = key > kth
    tie = key == kth
    cut = tl.full((), 0x7FFFFFFF, tl.int32)  # every tie
    if ties > need:
        cut = _nth_smallest(idx, tie, need, IDX_BITS)
    take = above | (tie & (idx <= cut))
    slot = tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(out_row + slot, idx - start, mask=take)


@triton.jit
def select_candidates(
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
    CAP: tl.constexpr,
    IDX_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
    K_BLOCK: tl.constexpr,
    PAIRS: tl.constexpr,
    RADIX: tl.constexpr,
    EARLY: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    start, end = window(starts_ptr, ends_ptr, row, L)
    out_row = out_ptr + row * k
    if end - start <= k:
        # Short row: every position, in order, then -1 padding (the reference's rule).
        for o in range(0, k, K_BLOCK):
            ko = o + tl.arange(0, K_BLOCK)
            tl.store(out_row + ko, tl.where(ko < end - start, ko, -1), mask=ko < k)
    else:
        n = tl.load(count_ptr + row * COUNT_STRIDE)
        t = tl.load(thresh_ptr + row).to(tl.uint32, bitcast=True)
        key_row = cand_key_ptr + row * CAP
        idx_row = cand_idx_ptr + row * CAP
        # Half a tile when the candidates fit: the search's work is per lane, used or not.
        if n <= CAP // 2:
            _select_tile(
                key_row, idx_row, out_row, n, k, t, start, CAP // 2, IDX_BITS, PAIRS, RADIX,
                EARLY, RADIX_BITS,
            )  # fmt: skip
        elif n <= CAP:
            _select_tile(
                key_row, idx_row, out_row, n, k, t, start, CAP, IDX_BITS, PAIRS, RADIX, EARLY,
                RADIX_BITS,
            )  # fmt: skip
        else:
            radix_select_row(logits_ptr + row * row_stride, out_row, start, end, L, k, t, BLOCK)
