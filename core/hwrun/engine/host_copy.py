"""Copies between host and device that never make the host wait for more than it reads.

CUDA stages a copy from pageable host memory synchronously: ``tensor.to("cuda")`` from an
ordinary CPU tensor returns only once the stream has reached the copy, i.e. after every kernel
queued before it. Async scheduling prepares step N+1 while step N runs on the device, so each
such copy in the preparation would wait for step N and undo the overlap. Copies from pinned
(page-locked) memory with ``non_blocking=True`` are queued and return at once; torch's caching
host allocator keeps a pinned block from reuse until the copy that reads it has run.

The other way, ``tensor.tolist()`` on a CUDA tensor waits for everything queued on the stream,
including a step launched after the tensor was made: async scheduling reads step N's tokens
after step N+1 is queued, and such a read would wait for step N+1 too (the whole overlap lost;
on the H200 a serving decode step took device time plus all host work, 9.4 ms for ~6.7 ms of
device time). :class:`HostCopy` queues the copy when the tensor is made and waits for that copy
only.
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


class HostCopy:
    """``tensor``'s values on the host, copied as soon as the stream reaches this call: the
    copy into pinned memory is queued here and :meth:`tolist` waits for it alone, not for work
    queued on the stream afterwards."""

    def __init__(self, tensor: torch.Tensor):
        self._event = None
        if tensor.device.type != "cuda":
            self._host = tensor
            return
        self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def tolist(self) -> list:
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()
