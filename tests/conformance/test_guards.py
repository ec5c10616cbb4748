"""Guard bytes catch writes outside a (possibly strided) output and ignore writes inside it."""

from __future__ import annotations

import torch

from hwrun_conformance.guards import guard_damage, guarded_copy


def _strided_cache() -> torch.Tensor:
    packed = torch.zeros(4, 3 * 8 + 5, dtype=torch.uint8)  # block stride > block bytes
    return packed[:, : 3 * 8].view(4, 3, 8)


def test_in_bounds_writes_are_fine() -> None:
    guarded = guarded_copy(_strided_cache(), "cpu", seed=1)
    assert guarded.view.stride() == _strided_cache().stride()
    guarded.view[2, 1] = 7
    assert guard_damage(guarded) is None


def test_writes_past_the_end_and_between_blocks_are_caught() -> None:
    guarded = guarded_copy(_strided_cache(), "cpu", seed=2)
    view = guarded.view
    past_end = torch.as_strided(view, (1,), (1,), view.storage_offset() + 3 * 29 + 24)
    past_end.fill_(past_end.item() ^ 0xFF)
    assert "after" in guard_damage(guarded)

    guarded = guarded_copy(_strided_cache(), "cpu", seed=3)
    view = guarded.view
    gap = torch.as_strided(view, (1,), (1,), view.storage_offset() + 24)  # block 0's padding
    gap.fill_(gap.item() ^ 0xFF)
    assert "between rows" in guard_damage(guarded)
