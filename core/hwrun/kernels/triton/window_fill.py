"""-inf outside each row's key window, in place: what the logits ops' contracts put where a
row has no key, for kernels (DeepGEMM's) that leave those columns unwritten or arbitrary.

A tile wholly inside its row's window exits after two loads, so the cost is the writes the
contract asks for. The torch way (comparisons of every column against the windows, then
masked_fill into a copy) took ~73 ms of a 454 ms prefill step of 8192 tokens at 32K context on
the H200 (16 layers), reading and writing every column."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

BLOCK = 1024


@triton.jit
def _fill_outside(
    logits_ptr,  # [R, >= width] float32, unit column stride
    starts_ptr,  # [R] int32 (unused without HAS_STARTS: every window starts at 0)
    ends_ptr,  # [R] int32
    stride_row,
    width,
    HAS_STARTS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * BLOCK
    start = 0
    if HAS_STARTS:
        start = tl.load(starts_ptr + row)
    end = tl.load(ends_ptr + row)
    if (first < start) | (first + BLOCK > end):
        cols = first + tl.arange(0, BLOCK)
        outside = ((cols < start) | (cols >= end)) & (cols < width)
        tl.store(logits_ptr + row * stride_row + cols, float("-inf"), mask=outside)


def fill_outside_windows(
    logits: torch.Tensor,  # [R, N] float32, unit column stride; written in place
    starts: torch.Tensor | None,  # [R] int32, or None: windows start at 0
    ends: torch.Tensor,  # [R] int32
) -> torch.Tensor:
    """``logits`` with -inf at the columns of row r outside ``[starts[r], ends[r])``."""
    rows, width = logits.shape
    if logits.stride(1) != 1:
        raise ValueError(f"fill_outside_windows needs unit column stride, got {logits.stride()}")
    if rows and width:
        _fill_outside[(rows, triton.cdiv(width, BLOCK))](
            logits, ends if starts is None else starts, ends, logits.stride(0), width,
            HAS_STARTS=starts is not None, BLOCK=BLOCK, **pdl_options(logits.device),
        )  # fmt: skip
    return logits
