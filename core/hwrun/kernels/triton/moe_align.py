"""Step 1 of the fused MoE (``moe.py``): the routed slots grouped by expert, in one launch.

Each expert's run of slots is padded to a multiple of ``BLOCK_M`` rows, and every row block
records its expert, so the GEMM kernels walk row blocks of one expert each. The number of
blocks is bounded by the shapes alone, so nothing is read back on the host (CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel


@dataclass(frozen=True)
class ExpertLayout:
    """Slots grouped by expert: what the GEMM kernels walk.

    Slot ``s < N`` is routed slot ``s = t * k + j``; slot ``N + t`` is token t's shared-expert
    slot, in group ``E`` (after the routed experts) when the layout has one.
    """

    sorted_slots: torch.Tensor  # [P] int32 slot of each row, -1 on padding rows
    block_expert: torch.Tensor  # [P / BLOCK_M] int32 group of each row block, -1 past the end
    num_blocks: int
    routed_slots: int  # N = T * k


@triton.jit
def _align_kernel(
    ids_ptr,  # [N] int32 expert of each routed slot
    sorted_ptr,  # [P] int32 out
    block_expert_ptr,  # [P / BLOCK_M] int32 out
    N,
    T,
    E,
    num_groups,  # E, or E + 1 with the shared group
    num_blocks,
    HAS_SHARED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BINS: tl.constexpr,  # a power of two >= E + 2: bins 0..E for the groups, the last unserved
    CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    """Program g < num_groups writes group g's run (its slots in flat order, then -1 padding)
    and its blocks' group; the last program marks the blocks after every run. Each program
    counts every group itself (a histogram of all ids), so one launch needs no grid sync."""
    wait_for_previous_kernel(PDL)
    g = tl.program_id(0)
    bins = tl.arange(0, BINS)
    counts = tl.zeros((BINS,), tl.int32)
    for start in range(0, N, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + offs, mask=offs < N, other=-1)
        counts += tl.histogram(tl.where((e >= 0) & (e < E), e, BINS - 1), BINS)
    counts = tl.where(bins < E, counts, 0)
    if HAS_SHARED:
        counts = tl.where(bins == E, T, counts)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, 0)
    mine = bins == g
    count = tl.sum(tl.where(mine, counts, 0), 0)
    end = tl.sum(tl.where(mine, block_end, 0), 0)
    first = end - tl.sum(tl.where(mine, blocks, 0), 0)
    if g < E:
        rank = g * 0  # an int32 scalar, the slots of this group placed so far
        for start in range(0, N, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            hit = tl.load(ids_ptr + offs, mask=offs < N, other=-1) == g
            position = rank + tl.cumsum(hit.to(tl.int32), 0) - 1
            tl.store(sorted_ptr + first * BLOCK_M + position, offs, mask=hit)
            rank += tl.sum(hit.to(tl.int32), 0)
    if HAS_SHARED:  # noqa: SIM102 (a constexpr test apart from the runtime one, for Triton's jit)
        if g == E:
            for start in range(0, T, CHUNK):
                offs = start + tl.arange(0, CHUNK)
                tl.store(sorted_ptr + first * BLOCK_M + offs, N + offs, mask=offs < T)
    if g < num_groups:
        pad = first * BLOCK_M + count + tl.arange(0, BLOCK_M)
        tl.store(sorted_ptr + pad, -1, mask=pad < end * BLOCK_M)
        for b in range(first, end, CHUNK):
            ours = b + tl.arange(0, CHUNK)
            tl.store(block_expert_ptr + ours, g + tl.zeros_like(ours), mask=ours < end)
    else:
        total = tl.max(block_end, 0)
        for b in range(total, num_blocks, CHUNK):
            after = b + tl.arange(0, CHUNK)
            tl.store(block_expert_ptr + after, -1 + tl.zeros_like(after), mask=after < num_blocks)
        for r in range(total * BLOCK_M, num_blocks * BLOCK_M, CHUNK):
            after = r + tl.arange(0, CHUNK)
            tl.store(
                sorted_ptr + after, -1 + tl.zeros_like(after), mask=after < num_blocks * BLOCK_M
            )


def align_by_expert(
    ids: torch.Tensor,  # [T, k] int expert ids, -1 = not served here
    num_experts: int,
    block_m: int,
    with_shared: bool = False,
) -> ExpertLayout:
    """Group the slots by expert, each run padded to ``block_m`` rows, in one launch.

    An id outside ``0..E-1`` joins no run (the GPU path cannot raise on a value without reading
    it on the host). Slots of one expert keep their flat order. ``with_shared`` adds group E:
    one slot per token for the shared experts. The number of blocks is bounded by the shapes:
    each nonempty run wastes at most ``block_m - 1`` rows.
    """
    tokens = ids.shape[0]
    slots = ids.numel()
    num_blocks = (slots + min(num_experts, slots) * (block_m - 1)) // block_m
    if with_shared:
        num_blocks += triton.cdiv(tokens, block_m)
    sorted_slots = torch.empty(num_blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=ids.device)
    layout = ExpertLayout(sorted_slots, block_expert, num_blocks, slots)
    if num_blocks == 0:
        return layout
    num_groups = num_experts + int(with_shared)
    prepare_launch()
    flat_ids = ids.reshape(-1).to(torch.int32).contiguous()
    if slots == 0:  # the shared group alone: never read, but launches want a real pointer
        flat_ids = sorted_slots
    _align_kernel[(num_groups + 1,)](
        flat_ids,
        sorted_slots,
        block_expert,
        slots,
        tokens,
        num_experts,
        num_groups,
        num_blocks,
        HAS_SHARED=with_shared,
        BLOCK_M=block_m,
        BINS=triton.next_power_of_2(num_experts + 2),
        CHUNK=256,
        **pdl_options(flat_ids.device),
    )
    return layout
