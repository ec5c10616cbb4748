"""Host-to-device copies that never make the host wait for the device.

CUDA stages a copy from pageable host memory synchronously: ``tensor.to("cuda")`` from an
ordinary CPU tensor returns only once the stream has reached the copy, i.e. after every kernel
queued before it. Async scheduling prepares step N+1 while step N runs on the device, so each
such copy in the preparation would wait for step N and undo the overlap. Copies from pinned
(page-locked) memory with ``non_blocking=True`` are queued and return at once; torch's caching
host allocator keeps a pinned block from reuse until the copy that reads it has run.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(values: list | np.ndarray | torch.Tensor, dtype: torch.dtype, device: torch.device):
    """``values`` as a ``dtype`` tensor on ``device``, queued without waiting on a CUDA device."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
