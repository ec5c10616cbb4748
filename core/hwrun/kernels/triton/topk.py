"""indexer.topk as a radix select: find the k-th largest key by histograms, then gather.

Each float is mapped to an order-preserving uint32 key. Up to four histogram passes of 8 bits
narrow the threshold key T; each pass is one launch of (rows x chunks) programs that add their
256-bin histograms atomically, so a row is spread over many multiprocessors (one program per
row of 131072 floats would take ~0.1 ms per pass). The next pass re-derives the selection from
the finished histogram (every program the same), and stops early once the bin of the k-th key
is taken whole. A last one-program-per-row pass writes every index whose key is above T and
the first (smallest-index) keys equal to T, so the result is the reference's set, ties
included. No sort: the output order is not by score (the contract compares sets).
256 bins, not more: Triton's histogram costs about bins / 32 * log2(bins) operations per 32
elements, which made 2048 bins ten times slower than torch.topk on the H200.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

RADIX_BITS = 8
NUM_BINS = 1 << RADIX_BITS
PASSES = 32 // RADIX_BITS


@triton.jit
def _sortable_key(x):
    # The reference's order: NaN counts as -inf and -0.0 equals +0.0. Then IEEE order as
    # unsigned order: flip all bits of negatives, set the sign bit of positives.
    x = tl.where(x != x, float("-inf"), x)
    x = tl.where(x == 0.0, 0.0, x)
    u = x.to(tl.uint32, bitcast=True)
    neg = (u >> 31) == 1
    return tl.where(neg, u ^ 0xFFFFFFFF, u | 0x80000000)


@triton.jit
def _select(state_ptr, hist_ptr, row, R, k, shift):
    """The selection state after the histogram of digit ``shift``: prefix of the k-th key's
    bits, mask of the bits fixed, keys still to take at the prefix, and a flag: 0 searching,
    1 done with every key at the prefix taken, 2 done with ties at the full key to cut."""
    base = state_ptr + row * 4
    prefix = tl.load(base).to(tl.uint32, bitcast=True)
    hmask = tl.load(base + 1).to(tl.uint32, bitcast=True)
    remaining = tl.load(base + 2)
    done = tl.load(base + 3)
    bins = tl.arange(0, 256)
    hist = tl.load(hist_ptr + row * 256 + bins)
    total = tl.sum(hist, 0)
    cum = tl.cumsum(hist, 0)
    above_incl = total - cum + hist  # keys in this bin or any higher bin
    chosen = tl.sum((above_incl >= remaining).to(tl.int32), 0) - 1
    in_bin = tl.sum(tl.where(bins == chosen, hist, 0), 0)
    above = tl.sum(tl.where(bins == chosen, total - cum, 0), 0)
    searching = done == 0
    new_remaining = remaining - above
    new_prefix = prefix | (chosen.to(tl.uint32) << shift)
    new_hmask = hmask | (tl.full((), 0xFF, tl.uint32) << shift)
    new_done = tl.where(in_bin == new_remaining, 1, tl.where(shift == 0, 2, 0))
    prefix = tl.where(searching, new_prefix, prefix)
    hmask = tl.where(searching, new_hmask, hmask)
    remaining = tl.where(searching, new_remaining, remaining)
    done = tl.where(searching, new_done, done)
    return prefix, hmask, remaining, done


@triton.jit
def _store_state(state_ptr, row, prefix, hmask, remaining, done):
    base = state_ptr + row * 4
    tl.store(base, prefix.to(tl.int32, bitcast=True))
    tl.store(base + 1, hmask.to(tl.int32, bitcast=True))
    tl.store(base + 2, remaining)
    tl.store(base + 3, done)


@triton.jit
def _histogram_pass(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    state_ptr,  # [PASSES + 1, R, 4] int32
    hist_ptr,  # [PASSES, R, 256] int32, zeroed
    row_stride,
    R,
    L,
    k,
    chunk,
    PASS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    start = tl.load(starts_ptr + row)
    end = tl.load(ends_ptr + row)
    shift = 24 - 8 * PASS
    if PASS == 0:
        prefix = tl.zeros((), tl.uint32)
        hmask = tl.zeros((), tl.uint32)
        done = (end - start <= k).to(tl.int32)
        if part == 0:
            _store_state(state_ptr, row, prefix, hmask, k + tl.zeros((), tl.int32), done)
    else:
        prev = state_ptr + (PASS - 1) * R * 4
        prefix, hmask, remaining, done = _select(
            prev, hist_ptr + (PASS - 1) * R * 256, row, R, k, shift + 8
        )
        if part == 0:
            _store_state(state_ptr + PASS * R * 4, row, prefix, hmask, remaining, done)
    if done == 0:
        row_ptr = logits_ptr + row * row_stride
        offs = tl.arange(0, BLOCK)
        hist = tl.zeros((256,), dtype=tl.int32)
        lo = part * chunk
        hi = tl.minimum(lo + chunk, L)
        for o in range(lo, hi, BLOCK):
            # Chunks start on BLOCK boundaries and loads are masked only by the row end L
            # (reads outside the window stay inside the row): 16-byte vector loads.
            idx = tl.multiple_of(o, 16) + offs
            key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
            match = (idx >= start) & (idx < end) & ((key & hmask) == prefix)
            digit = ((key >> shift) & 255).to(tl.int32)
            hist += tl.histogram(digit, 256, mask=match)
        tl.atomic_add(hist_ptr + (PASS * R + row) * 256 + tl.arange(0, 256), hist, sem="relaxed")


@triton.jit
def _gather_pass(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    state_ptr,  # [PASSES + 1, R, 4] int32
    hist_ptr,  # [PASSES, R, 256] int32
    out_ptr,  # [R, k] int32
    counter_ptr,  # [R, 2] int32, zeroed
    row_stride,
    R,
    L,
    k,
    chunk,
    BLOCK: tl.constexpr,
    K_BLOCK: tl.constexpr,
    LAST: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    """Keys above the threshold prefix go anywhere in [0, k - remaining), keys at it after
    them, at slots reserved from a per-row atomic counter (the contract compares sets). When the
    threshold is a full key with more ties than slots, _tie_pass places the ties instead."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    start = tl.load(starts_ptr + row)
    end = tl.load(ends_ptr + row)
    out_row = out_ptr + row * k
    if end - start <= k:
        if part == 0:
            # Short row: every position, in order, then -1 padding (the reference's rule).
            for o in range(0, k, K_BLOCK):
                ko = o + tl.arange(0, K_BLOCK)
                tl.store(out_row + ko, tl.where(ko < end - start, ko, -1), mask=ko < k)
    else:
        prefix, hmask, remaining, flag = _select(
            state_ptr + LAST * R * 4, hist_ptr + LAST * R * 256, row, R, k, 0
        )
        row_ptr = logits_ptr + row * row_stride
        offs = tl.arange(0, BLOCK)
        lo = part * chunk
        hi = tl.minimum(lo + chunk, L)
        for o in range(lo, hi, BLOCK):
            idx = tl.multiple_of(o, 16) + offs
            valid = (idx >= start) & (idx < end) & (idx < hi)
            key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
            top = key & hmask
            is_above = valid & (top > prefix)
            # flag 1 lets every key at the prefix in. A broadcast of flag == 1 rather than a
            # scalar `&`: Triton 3.9's interpreter turns block & scalar-bool into int32 data.
            is_equal = valid & (top == prefix) & (tl.zeros_like(offs) + flag == 1)
            rel = idx - start
            # One atomic per block and operand (per-element atomics on one counter serialize:
            # 2048 of them cost ~0.2 ms for a single row); ranks inside the block by a scan.
            n_above = tl.sum(is_above.to(tl.int32), 0)
            if n_above > 0:
                base = tl.atomic_add(counter_ptr + row * 2, n_above, sem="relaxed")
                rank = base + tl.cumsum(is_above.to(tl.int32), 0) - 1
                tl.store(out_row + rank, rel, mask=is_above)
            n_equal = tl.sum(is_equal.to(tl.int32), 0)
            if n_equal > 0:
                base = tl.atomic_add(counter_ptr + row * 2 + 1, n_equal, sem="relaxed")
                rank = base + tl.cumsum(is_equal.to(tl.int32), 0) - 1
                tl.store(out_row + (k - remaining) + rank, rel, mask=is_equal)
        if (part == 0) & (flag == 2):
            # Ties at the full key: the smallest indices win, in one ordered sweep.
            n_equal = 0
            first = (start // 16) * 16
            for o in range(first, L, BLOCK):
                idx = tl.multiple_of(o, 16) + offs
                valid = (idx >= start) & (idx < end)
                key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
                is_equal = valid & (key == prefix)
                rank = n_equal + tl.cumsum(is_equal.to(tl.int32), 0) - 1
                take = is_equal & (rank < remaining)
                tl.store(out_row + (k - remaining) + rank, idx - start, mask=take)
                n_equal += tl.sum(is_equal.to(tl.int32), 0)


@triton.jit
def radix_select_row(row_ptr, out_row, start, end, L, k, t, BLOCK: tl.constexpr):
    """One program's exact top-k of the window [start, end) of a row, among keys >= t (a bound
    known to be at most the k-th key; 0 for none): four 8-bit histogram passes over the window
    narrow the k-th key, then one ordered sweep writes the winners, ties by smallest index.
    The threshold kernel's slow path for rows with more candidates than its buffer holds."""
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    first = (start // BLOCK) * BLOCK
    prefix = tl.zeros((), tl.uint32)
    hmask = tl.zeros((), tl.uint32)
    remaining = k + start * 0
    for p in tl.static_range(4):
        hist = tl.zeros((256,), tl.int32)
        for o in range(first, end, BLOCK):
            idx = tl.multiple_of(o, 16) + offs
            key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
            match = (idx >= start) & (idx < end) & (key >= t) & ((key & hmask) == prefix)
            hist += tl.histogram(((key >> (24 - 8 * p)) & 255).to(tl.int32), 256, mask=match)
        total = tl.sum(hist, 0)
        higher = total - tl.cumsum(hist, 0)  # keys in higher bins
        chosen = tl.sum((higher + hist >= remaining).to(tl.int32), 0) - 1
        remaining -= tl.sum(tl.where(bins == chosen, higher, 0), 0)
        prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * p))
        hmask = hmask | (tl.full((), 255, tl.uint32) << (24 - 8 * p))
    taken = 0
    ties = 0
    for o in range(first, end, BLOCK):
        idx = tl.multiple_of(o, 16) + offs
        key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
        inside = (idx >= start) & (idx < end)
        tie = inside & (key == prefix)
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
        take = (inside & (key > prefix)) | (tie & (tie_rank < remaining))
        slot = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(out_row + slot, idx - start, mask=take)
        taken += tl.sum(take.to(tl.int32), 0)
        ties += tl.sum(tie.to(tl.int32), 0)


def checked_args(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
) -> torch.Tensor:  # logits with unit column stride
    """The top-k kernels' argument checks (shapes, dtype, k); logits made column-contiguous."""
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(
            f"topk: logits must be [R, L] float32, got {tuple(logits.shape)} {logits.dtype}"
        )
    R = logits.shape[0]
    if starts.shape != (R,) or ends.shape != (R,):
        raise ValueError(
            f"topk: starts and ends must be [R]=[{R}], got {tuple(starts.shape)} and "
            f"{tuple(ends.shape)}"
        )
    if k <= 0:
        raise ValueError(f"topk: k must be positive, got {k}")
    return logits if logits.stride(1) == 1 else logits.contiguous()


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
    block: int = 4096,
    num_warps: int = 8,
    chunks: int | None = None,
    gather_block: int = 4096,
) -> torch.Tensor:  # [R, k] int32, indices relative to starts, -1 padded
    """Top-k positions of each row's window ``[starts[r], ends[r])`` of ``logits``."""
    logits = checked_args(logits, starts, ends, k)
    R, L = logits.shape
    out = torch.empty((R, k), dtype=torch.int32, device=logits.device)
    if R == 0:
        return out
    starts_c = starts.to(torch.int32).clamp(0, L)
    ends_c = torch.maximum(ends.to(torch.int32).clamp(0, L), starts_c)
    if chunks is None:
        sms = (
            torch.cuda.get_device_properties(logits.device).multi_processor_count
            if logits.is_cuda
            else 1
        )
        chunks = triton.cdiv(8 * sms, R)  # the best of a grid on the H200 at R=64
    chunks = max(1, min(chunks, triton.cdiv(L, block)))
    chunk = triton.cdiv(triton.cdiv(L, chunks), block) * block
    chunks = triton.cdiv(L, chunk)
    state = torch.empty((PASSES + 1, R, 4), dtype=torch.int32, device=logits.device)
    hist = torch.zeros((PASSES, R, NUM_BINS), dtype=torch.int32, device=logits.device)
    args = (logits, starts_c, ends_c, state, hist, logits.stride(0), R, L, k)
    prepare_launch()
    for p in range(PASSES):
        _histogram_pass[(R, chunks)](
            *args, chunk, PASS=p, BLOCK=block, num_warps=num_warps, **pdl_options(logits.device)
        )
    counters = torch.zeros((R, 2), dtype=torch.int32, device=logits.device)
    _gather_pass[(R, chunks)](
        *args[:5],
        out,
        counters,
        *args[5:],
        chunk,
        BLOCK=gather_block,
        K_BLOCK=min(triton.next_power_of_2(k), 4096),
        LAST=PASSES - 1,
        num_warps=num_warps,
        **pdl_options(logits.device),
    )
    return out
