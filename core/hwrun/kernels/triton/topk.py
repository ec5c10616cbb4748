"""indexer.topk as a radix select: find the k-th largest key by histograms, then gather.

One program per row. Each float is mapped to an order-preserving uint32 key; up to three
histogram passes of 11 bits narrow the threshold key T (a pass stops early once the bin that
holds the k-th key is taken whole); a last pass writes every index whose key is above T and
the first (smallest-index) keys equal to T, so the result is the reference's set, ties
included. A row is read 2 to 4 times; rows of a decode batch fit in L2, so only the first
pass costs HBM bandwidth. No sort: the output order is not by score (the contract compares
sets).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

RADIX_BITS = 11


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
def _topk_kernel(
    logits_ptr,  # [R, L] float32
    starts_ptr,  # [R] int32
    ends_ptr,  # [R] int32
    out_ptr,  # [R, k] int32
    row_stride,
    L,
    k,
    BLOCK: tl.constexpr,
    BITS: tl.constexpr,
    K_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    # Windows are clamped to [0, L] on the host. Loops run to L (not to the row's length) so
    # that their bounds are launch arguments; positions past `end` are masked and cost no reads.
    start = tl.load(starts_ptr + row)
    end = tl.load(ends_ptr + row)
    length = end - start
    # Chunks start on a 16-element boundary and loads are masked only by the row end L (reads
    # outside the window stay inside the row), so that loads are 16-byte vectors.
    first = (start // 16) * 16
    row_ptr = logits_ptr + row * row_stride
    out_row = out_ptr + row * k
    NB: tl.constexpr = 1 << BITS
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, NB)

    if length <= k:
        # Short row: every position, in order, then -1 padding (the reference's rule).
        for o in range(0, k, K_BLOCK):
            ko = o + tl.arange(0, K_BLOCK)
            tl.store(out_row + ko, tl.where(ko < length, ko, -1), mask=ko < k)
    else:
        remaining = k  # keys still to take at or below the current prefix
        prefix = tl.zeros((), dtype=tl.uint32)
        hmask = tl.zeros((), dtype=tl.uint32)  # bits of the key fixed so far
        shift = 32 - BITS
        searching = True
        while searching:
            hist = tl.zeros((NB,), dtype=tl.int32)
            for o in range(first, L, BLOCK):
                idx = tl.multiple_of(o, 16) + offs
                valid = (idx >= start) & (idx < end)
                key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
                match = valid & ((key & hmask) == prefix)
                digit = ((key >> shift) & (NB - 1)).to(tl.int32)
                hist += tl.histogram(digit, NB, mask=match)
            total = tl.sum(hist, 0)
            cum = tl.cumsum(hist, 0)
            above_incl = total - cum + hist  # keys in this bin or any higher bin
            chosen = tl.sum((above_incl >= remaining).to(tl.int32), 0) - 1
            in_bin = tl.sum(tl.where(bins == chosen, hist, 0), 0)
            above = tl.sum(tl.where(bins == chosen, total - cum, 0), 0)
            remaining -= above
            prefix = prefix | (chosen.to(tl.uint32) << shift)
            hmask = tl.full((), 0xFFFFFFFF, tl.uint32) << shift
            searching = (shift > 0) & (in_bin != remaining)
            shift = tl.maximum(shift - BITS, 0)

        # Gather: keys above the prefix anywhere in [0, k - remaining), equal keys after them
        # in index order (smallest index wins a tie).
        n_above = 0
        n_equal = 0
        base_eq = k - remaining
        for o in range(first, L, BLOCK):
            idx = tl.multiple_of(o, 16) + offs
            valid = (idx >= start) & (idx < end)
            key = _sortable_key(tl.load(row_ptr + idx, mask=idx < L, other=0.0))
            hi = key & hmask
            is_above = valid & (hi > prefix)
            is_equal = valid & (hi == prefix)
            above_rank = n_above + tl.cumsum(is_above.to(tl.int32), 0) - 1
            equal_rank = n_equal + tl.cumsum(is_equal.to(tl.int32), 0) - 1
            rel = idx - start
            tl.store(out_row + above_rank, rel, mask=is_above)
            take_eq = is_equal & (equal_rank < remaining)
            tl.store(out_row + base_eq + equal_rank, rel, mask=take_eq)
            n_above += tl.sum(is_above.to(tl.int32), 0)
            n_equal += tl.sum(is_equal.to(tl.int32), 0)


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
    block: int = 4096,
    num_warps: int = 16,
) -> torch.Tensor:  # [R, k] int32, indices relative to starts, -1 padded
    """Top-k positions of each row's window ``[starts[r], ends[r])`` of ``logits``."""
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(
            f"topk: logits must be [R, L] float32, got {tuple(logits.shape)} {logits.dtype}"
        )
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    R, L = logits.shape
    if starts.shape != (R,) or ends.shape != (R,):
        raise ValueError(
            f"topk: starts and ends must be [R]=[{R}], got {tuple(starts.shape)} and "
            f"{tuple(ends.shape)}"
        )
    if k <= 0:
        raise ValueError(f"topk: k must be positive, got {k}")
    out = torch.empty((R, k), dtype=torch.int32, device=logits.device)
    starts_c = starts.to(torch.int32).clamp(0, L)
    ends_c = torch.maximum(ends.to(torch.int32).clamp(0, L), starts_c)
    if R == 0:
        return out
    _topk_kernel[(R,)](
        logits,
        starts_c,
        ends_c,
        out,
        logits.stride(0),
        L,
        k,
        BLOCK=block,
        BITS=RADIX_BITS,
        K_BLOCK=min(triton.next_power_of_2(k), 4096),
        num_warps=num_warps,
    )
    return out
