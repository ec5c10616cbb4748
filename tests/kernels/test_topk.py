"""indexer.topk Triton kernel (radix select) against the reference, in the CPU interpreter."""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton.topk import topk
from hwrun.ops.topk import topk as reference


def _check(logits, starts, ends, k):
    got = topk(logits, starts, ends, k, block=256, num_warps=4, chunks=3, gather_block=128)
    want = reference(logits, starts, ends, k)
    assert got.shape == want.shape and got.dtype == torch.int32
    for r in range(logits.shape[0]):
        assert sorted(got[r].tolist()) == sorted(want[r].tolist()), f"row {r}"


@pytest.mark.parametrize("seed", [0, 1])
def test_topk_matches_reference_sets(seed):
    g = torch.Generator().manual_seed(seed)
    rows, length, k = 6, 1500, 48
    logits = torch.randn(rows, length, generator=g)
    logits[1, :700] = 0.0  # ReLU zeros: a tie at the threshold, smallest index wins
    logits[1, 100:300] = -0.0  # -0.0 ties with +0.0
    logits[2] = torch.round(logits[2] * 2)  # many ties everywhere
    logits[3, ::3] = float("nan")  # NaN counts as -inf
    logits[4, :] = float("-inf")  # all -inf: still candidates, smallest index first
    logits[4, 10] = 1.0
    starts = torch.tensor([0, 10, 0, 0, 5, 600], dtype=torch.int32)
    ends = torch.tensor([1500, 1400, 1500, 1500, 1200, 1500], dtype=torch.int32)
    _check(logits, starts, ends, k)


def test_topk_short_and_empty_rows_pad_with_minus_one():
    logits = torch.randn(3, 300)
    starts = torch.tensor([0, 100, 50], dtype=torch.int32)
    ends = torch.tensor([20, 100, 64], dtype=torch.int32)
    got = topk(logits, starts, ends, 32, block=128, num_warps=4, gather_block=128)
    assert got[0].tolist() == [*range(20), *([-1] * 12)]
    assert got[1].tolist() == [-1] * 32
    assert sorted(got[2].tolist()[:14]) == list(range(14)) and got[2, 14:].eq(-1).all()


def test_topk_equal_scores_take_smallest_indices():
    logits = torch.zeros(1, 1000)
    logits[0, 900:] = 5.0  # 100 clear winners, then 924 ties at 0 for the rest
    got = topk(
        logits, torch.tensor([0], dtype=torch.int32), torch.tensor([1000], dtype=torch.int32), 128
    )
    assert sorted(got[0].tolist()) == sorted([*range(900, 1000), *range(28)])
