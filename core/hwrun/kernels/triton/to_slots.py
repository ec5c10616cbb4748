"""indexer.to_slots as one Triton launch: logical token positions -> physical cache slots.

``slot = block_table[req, i // block_size] * block_size + i % block_size``, where ``req`` is
the row's request: ``request_of_row[r]``, or ``r // (R // B)`` for request-major rows (the
``[B * n]`` rows of ``indexer.logits_paged``). A program maps a ``[BLOCK_R, BLOCK_K]`` tile.

-1 stays -1. What the reference raises for (another negative position, a position past the
table, an unallocated table entry, a request outside the table) gives -1 here, with no read
outside the tensors: checking it would read values on the host, and this impl must not
synchronise (a CUDA graph captures it). Every slot depends only on its own position and its
row's table row, so the result is the same whatever the batch or the tiling.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun import knobs
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel
from hwrun.ops.topk import to_slots_arg_problems


@triton.jit
def _to_slots_kernel(
    indices_ptr,  # [R, K] int32 / int64, -1 = no token
    table_ptr,  # [B, max_blocks] int32 / int64, < 0 = unallocated
    request_ptr,  # [R] int (unused without HAS_REQUEST)
    slots_ptr,  # [R, K] int32
    R,
    K,
    B,
    max_blocks,
    rows_per_request,
    stride_ir,
    stride_ik,
    stride_tb,
    stride_tm,
    HAS_REQUEST: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_in = r < R
    mask = row_in[:, None] & (c[None, :] < K)
    if HAS_REQUEST:
        req = tl.load(request_ptr + r, mask=row_in, other=-1).to(tl.int64)
    else:
        req = (r // rows_per_request).to(tl.int64)
    position = tl.load(
        indices_ptr + r[:, None].to(tl.int64) * stride_ir + c[None, :] * stride_ik,
        mask=mask,
        other=-1,
    ).to(tl.int64)
    block = position // BLOCK_SIZE
    inside = (position >= 0) & (block < max_blocks) & ((req >= 0) & (req < B))[:, None]
    entry = tl.load(
        table_ptr + req[:, None] * stride_tb + block * stride_tm, mask=mask & inside, other=-1
    ).to(tl.int64)
    slot = entry * BLOCK_SIZE + position % BLOCK_SIZE
    slot = tl.where(inside & (entry >= 0), slot, -1)
    tl.store(slots_ptr + r[:, None].to(tl.int64) * K + c[None, :], slot.to(tl.int32), mask=mask)


def to_slots(
    indices: torch.Tensor,  # [R, k] int32, token positions within each row's request (-1 = none)
    block_table: torch.Tensor,  # [B, max_blocks] int32
    block_size: int,
    request_of_row: torch.Tensor | None = None,  # [R] int, the request of each row
) -> torch.Tensor:  # [R, k] int32 physical slots, -1 where indices is -1
    """``indexer.to_slots`` (see :func:`hwrun.ops.topk.to_slots`) in one launch.

    :raises ValueError: a type or shape the reference refuses (values are not read).
    """
    problems = to_slots_arg_problems(indices, block_table, block_size, request_of_row)
    if problems:
        raise ValueError("indexer.to_slots: " + "; ".join(problems))
    rows, k = indices.shape
    requests, max_blocks = block_table.shape
    slots = torch.empty((rows, k), dtype=torch.int32, device=indices.device)
    if rows == 0 or k == 0:
        return slots
    block_k = min(triton.next_power_of_2(k), 1024)
    # ~1024 positions per program on a GPU (decode's 64 rows x 2048: 128 programs); the
    # interpreter pays per program, so it takes whole batches at once.
    lanes = 65536 if knobs.triton_interpret() else 1024
    block_r = min(triton.next_power_of_2(rows), max(1, lanes // block_k))
    prepare_launch()
    _to_slots_kernel[(triton.cdiv(rows, block_r), triton.cdiv(k, block_k))](
        indices,
        block_table,
        request_of_row.contiguous() if request_of_row is not None else indices,
        slots,
        rows,
        k,
        requests,
        max_blocks,
        rows // requests if request_of_row is None else 1,
        indices.stride(0),
        indices.stride(1),
        block_table.stride(0),
        block_table.stride(1),
        HAS_REQUEST=request_of_row is not None,
        BLOCK_SIZE=block_size,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        num_warps=4,
        **pdl_options(indices.device),
    )
    return slots
