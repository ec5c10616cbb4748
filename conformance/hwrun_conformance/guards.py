"""Guard bytes around the tensors an op writes in place, to catch out-of-bounds writes.

:func:`guarded_copy` places a copy of a tensor (with the same strides, so a strided cache view
stays strided) inside a larger byte buffer filled with a seeded pattern; every byte of the buffer
the view does not cover (the margins and the gaps between strided rows) is a guard byte.
:func:`guard_damage` counts the guard bytes that changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MARGIN_BYTES = 4096  # before and after the view


@dataclass
class Guarded:
    view: torch.Tensor  # what the op receives
    buffer: torch.Tensor  # uint8, the whole allocation
    pattern: torch.Tensor  # uint8, the buffer's bytes before the call
    covered: torch.Tensor  # bool per buffer byte: inside the view


def guarded_copy(t: torch.Tensor, device: str | torch.device, seed: int) -> Guarded:
    """A copy of ``t`` on ``device`` at the same strides, surrounded by guard bytes."""
    itemsize = t.element_size()
    span = _span_elements(t)
    offset_elems = -(-MARGIN_BYTES // itemsize)
    total_bytes = (2 * offset_elems + span) * itemsize
    generator = torch.Generator().manual_seed(seed)
    pattern = torch.randint(0, 256, (total_bytes,), dtype=torch.uint8, generator=generator)
    buffer = pattern.to(device, copy=True)
    typed = buffer.view(t.dtype)
    view = typed.as_strided(t.shape, t.stride(), offset_elems)
    view.copy_(t)
    covered = torch.zeros(total_bytes // itemsize, dtype=torch.bool)
    covered.as_strided(t.shape, t.stride(), offset_elems).fill_(True)
    covered = covered.repeat_interleave(itemsize)
    return Guarded(view, buffer, pattern, covered)


def guard_damage(guarded: Guarded) -> str | None:
    """None when every guard byte is intact, else how many changed and where the first is."""
    now = guarded.buffer.cpu()
    changed = (now != guarded.pattern) & ~guarded.covered
    count = int(changed.sum())
    if count == 0:
        return None
    first = int(changed.nonzero()[0, 0])
    view_start = int(guarded.covered.nonzero()[0, 0])
    view_end = int(guarded.covered.nonzero()[-1, 0]) + 1
    side = "before" if first < view_start else "after" if first >= view_end else "between rows of"
    return (
        f"{count} guard bytes overwritten; first {side} the output "
        f"(buffer byte {first}, output spans bytes {view_start}..{view_end - 1})"
    )


def _span_elements(t: torch.Tensor) -> int:
    """Elements from the first to one past the last element the strided view touches."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
