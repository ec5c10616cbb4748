"""Programmatic dependent launch (PDL): a kernel that may start before the one ahead of it
in the stream has finished.

A decode step is ~650 launches, most of them a few microseconds long, so the time between one
kernel's last program and the next one's first useful instruction (the launch itself, the
programs' setup, the first loads' latency) is a visible share of the step. On Hopper and later
a kernel launched with PDL is scheduled as soon as every program of the kernel ahead of it has
signalled ``griddepcontrol.launch_dependents`` (or exited); it then runs until its own
``griddepcontrol.wait``, which returns once the kernel ahead has completed and its writes are
visible. CUDA graph capture keeps these edges.

The protocol every hwrun kernel follows (``PDL`` a constexpr, False on CPU and elsewhere):

1. before :func:`wait_for_previous_kernel`, only index arithmetic, and loads or L2 prefetches
   of memory no kernel of the step writes (weights);
2. :func:`wait_for_previous_kernel` in every program, before any other load or store: waiting
   in every program makes this kernel's completion imply its predecessor's, so the chain stays
   ordered even where the next kernel reads what an earlier one wrote;
3. right after the wait, the signal that lets the next kernel be scheduled: its programs then
   take the multiprocessors this kernel's last programs leave free, and wait in turn.

Kernels of other libraries (cuBLAS, FlashMLA, DeepGEMM, torch's) launch as they do: after one
of them a PDL kernel still waits for it, and before one of them nothing changes. torch
Inductor's own PDL mode (``TORCHINDUCTOR_ENABLE_PDL``) must stay off: it skips the wait where a
kernel's inputs do not come from the kernel compiled before it, which breaks step 2's chain
when hwrun's kernels sit between.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from hwrun import knobs
from hwrun.kernels.triton.descriptors import nvidia_sm90_or_later


@functools.cache
def _supports_pdl(device: torch.device) -> bool:
    # Cached: pdl_options runs at every launch, and the capability query is a few us of host.
    return nvidia_sm90_or_later(device)


def pdl_options(device: torch.device) -> dict:
    """Launch keywords for a kernel with a ``PDL`` constexpr: ``PDL`` and Triton's
    ``launch_pdl`` on where the device supports PDL and ``HWRUN_TRITON_PDL`` allows it, else
    nothing (the kernel's ``PDL=False`` default)."""
    if not _supports_pdl(device) or not knobs.triton_pdl():
        return {}
    return {"PDL": True, "launch_pdl": True}


def prefetch_lines(row_bytes: int) -> int:
    """How many 128-byte lines of each weight row a kernel prefetches for its first
    ``row_bytes`` bytes (its pipeline's first stages): a power of two, at most 16."""
    lines = max(1, row_bytes // 128)
    return min(16, 1 << (lines.bit_length() - 1))


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """Steps 2 and 3 of the module's protocol; nothing without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_to_l2(ptrs, mask, PDL: tl.constexpr):
    """Ask L2 for the lines at ``ptrs`` (where ``mask``) without waiting for them: a weight
    kernel's first tiles, fetched while the kernel ahead finishes (step 1 of the protocol)."""
    if PDL:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
            "=r,l,r",
            [ptrs, mask.to(tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
