"""Peak torch tensor memory of a block of code, from the allocator's own reports.

Neither tracemalloc nor RSS measures this: torch's CPU allocator takes memory with
posix_memalign, outside Python's allocator, so tracemalloc sees a 10 MB tensor as 80 bytes; and
ru_maxrss is a process-wide high-water mark that cannot be reset between tests. With
``profile_memory=True`` the c10 CPU allocator reports every allocation and free (bytes, time) to
the profiler; replaying them in time order gives the exact live-bytes curve of the block.
On CUDA the caching allocator keeps its own peak counter, which can be reset.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass
class TorchMemory:
    peak: int = 0  # highest live bytes allocated inside the block, over those live at entry
    net: int = 0  # bytes allocated inside the block and still live at its end
    events: int = 0


@contextmanager
def torch_cpu_memory() -> Iterator[TorchMemory]:
    """Live bytes of the c10 CPU allocator, replayed from the profiler's memory reports."""
    result = TorchMemory()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield result
    reports = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    live = 0
    for _, nbytes in reports:
        live += nbytes
        result.peak = max(result.peak, live)
    result.net, result.events = live, len(reports)


@contextmanager
def cuda_memory() -> Iterator[TorchMemory]:
    """The CUDA caching allocator's own counters (allocated bytes, not the reserved pool)."""
    result = TorchMemory()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    yield result
    torch.cuda.synchronize()
    result.peak = torch.cuda.max_memory_allocated() - base
    result.net = torch.cuda.memory_allocated() - base
