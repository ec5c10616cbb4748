"""fill_outside_windows (the DeepGEMM logits adapters' -inf) against a torch mask, in the CPU
interpreter: windows inside, across and beyond tile edges, empty, whole-row, and rows of a
wider (padded) tensor whose columns past the width stay untouched."""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton import window_fill
from hwrun.kernels.triton.window_fill import fill_outside_windows

I32 = torch.int32


def _expected(logits, starts, ends):
    cols = torch.arange(logits.shape[1])
    start = torch.zeros_like(ends) if starts is None else starts
    outside = (cols[None, :] < start[:, None]) | (cols[None, :] >= ends[:, None])
    return logits.masked_fill(outside, float("-inf"))


@pytest.mark.parametrize("with_starts", [True, False], ids=["ragged", "paged"])
def test_fills_exactly_the_columns_outside_each_window(monkeypatch, with_starts):
    monkeypatch.setattr(window_fill, "BLOCK", 64)  # several tiles per row in the interpreter
    g = torch.Generator().manual_seed(3)
    width = 300  # not a multiple of the tile
    padded = torch.randn(8, 320, generator=g)
    starts = torch.tensor([0, 5, 64, 100, 0, 299, 150, 0], dtype=I32)
    # 100..100 and 0..0: empty; end 1: a paged row's tail loop over every tile
    ends = torch.tensor([300, 70, 128, 100, 1, 300, 400, 0], dtype=I32)
    logits = padded[:, :width]
    want = _expected(logits.clone(), starts if with_starts else None, ends)
    got = fill_outside_windows(logits, starts if with_starts else None, ends)
    assert got.data_ptr() == padded.data_ptr()  # in place
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.isinf(padded[:, width:]).any()  # the padding past the width is not touched


def test_refuses_strided_columns():
    with pytest.raises(ValueError, match="unit column stride"):
        fill_outside_windows(torch.zeros(4, 8).t(), None, torch.zeros(8, dtype=I32))
