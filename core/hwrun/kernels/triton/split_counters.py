"""Zeroed int32 counters for kernels that add their split-K partial sums themselves.

A kernel whose K dimension is split over several programs per output tile can finish the tile
in the program that completes it last: each program stores its partial sums, counts itself on
the tile's counter (an acquire-release atomic), and the one that counts last adds every
partial in split order (the same bits whichever finished last), writes the output and sets
the counter back to zero. That saves the second launch that would otherwise add the partials.

Because every launch leaves its counters at zero, one buffer per device serves all of them in
turn, with no memset per call, as long as no two such launches run at once. In the engine none
do: the graph capture and its warm-up run after the main stream's work, and the decode side
stream (model.py's _fork) launches none of them (a buffer per stream gave every captured launch
a memset of its own, 45 us a decode step on the H200). A launch recorded while a CUDA graph is
being captured, before the buffer exists or when it is too small, gets counters of its own (a
memset node in the graph) and leaves the buffer alone.
"""

from __future__ import annotations

import torch

MIN_COUNTERS = 1 << 16  # 256 KB: every decode launch of the engine's shapes fits

_BUFFERS: dict[tuple[str, int | None], torch.Tensor] = {}


def zeroed_counters(count: int, device: torch.device) -> torch.Tensor:
    """``count`` int32 zeros that the kernel must leave at zero when it returns."""
    key = (device.type, device.index)
    buffer = _BUFFERS.get(key)
    if buffer is None or buffer.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.zeros(count, dtype=torch.int32, device=device)
        buffer = torch.zeros(max(count, MIN_COUNTERS), dtype=torch.int32, device=device)
        _BUFFERS[key] = buffer
    return buffer[:count]
