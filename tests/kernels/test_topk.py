"""indexer.topk Triton kernels against the reference, in the CPU interpreter: the threshold
kernel (the registered one) and the radix kernel it hands k > MAX_K to."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hwrun.kernels.triton.topk import topk as radix_topk
from hwrun.kernels.triton.topk_threshold import MAX_K, ThresholdTiles, candidate_counts, topk
from hwrun.ops.topk import topk as reference

# Small tiles so that the interpreter's shapes reach every path: several segment levels per
# call (M = 4k segments at most), compaction spread over programs, and a capacity that the
# constructed rows overflow.
# SMALL compacts by scanning every column (_compact); the others over the live segments'
# columns (_compact_live, the default).
SMALL = ThresholdTiles(
    segments=32, capacity=128, block=256, compact_block=64, chunks=3, by_segment=False
)
TINY_CAPACITY = ThresholdTiles(segments=32, capacity=16, block=256, compact_block=128)
BY_SEGMENT = ThresholdTiles(
    segments=32, capacity=128, block=256, compact_block=64, chunks=3, by_segment=True
)
PAIRS = ThresholdTiles(segments=32, capacity=128, block=256, compact_block=64, search_pairs=True)
I32 = torch.int32


def _assert_sets(got, want):
    assert got.shape == want.shape and got.dtype == torch.int32
    for r in range(want.shape[0]):
        assert sorted(got[r].tolist()) == sorted(want[r].tolist()), f"row {r}"


def _edge_rows(seed, length=1500):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(9, length, generator=g)
    logits[1, :700] = 0.0  # ReLU zeros: a tie at the threshold, smallest index wins
    logits[1, 100:300] = -0.0  # -0.0 ties with +0.0
    logits[2] = torch.round(logits[2] * 2)  # many ties everywhere
    logits[3, ::3] = float("nan")  # NaN counts as -inf
    logits[4, :] = float("-inf")  # all -inf: still candidates, smallest index first
    logits[4, 10] = 1.0
    logits[5] = torch.arange(length, dtype=torch.float32)  # sorted: whole segments qualify
    logits[6] = 0.5  # all equal
    logits[7, ::5] = float("inf")
    logits[8, 2::16] = 3.5  # ~94 ties at the k-th score in every segment: a full tile, cut
    starts = torch.tensor([0, 10, 0, 0, 5, 600, 3, 1, 0], dtype=I32)
    ends = torch.tensor([1500, 1400, 1500, 1500, 1200, 1500, 1497, 900, 1500], dtype=I32)
    return logits, starts, ends


@pytest.mark.parametrize(
    "tiles",
    [SMALL, TINY_CAPACITY, BY_SEGMENT, PAIRS],
    ids=["small", "tiny_capacity", "by_segment", "pairs"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_threshold_matches_reference_sets(seed, tiles):
    logits, starts, ends = _edge_rows(seed)
    _assert_sets(topk(logits, starts, ends, 16, tiles), reference(logits, starts, ends, 16))


def test_edge_rows_reach_every_selection_path():
    # Half tile, full tile (with ties at the k-th score cut by index), slow path.
    counts = candidate_counts(*_edge_rows(0), 16, SMALL)
    half, cap = SMALL.capacity // 2, SMALL.capacity
    assert (counts <= half).any() and (counts > cap).any(), counts
    assert half < counts[8] <= cap, counts


def test_compacting_by_segment_finds_the_same_candidates():
    """The live-segment compaction counts exactly the keys >= T that the column scan counts
    (every path: half tile, full tile, slow path), and selects the same sets on rows with
    short windows inside long ones (several levels per call)."""
    rows = _edge_rows(1)
    torch.testing.assert_close(
        candidate_counts(*rows, 16, BY_SEGMENT), candidate_counts(*rows, 16, SMALL)
    )
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 2048, generator=g)
    starts = torch.tensor([1000, 0, 1747, 3], dtype=I32)
    ends = torch.tensor([1300, 2048, 2047, 2045], dtype=I32)
    _assert_sets(topk(logits, starts, ends, 8, BY_SEGMENT), reference(logits, starts, ends, 8))


@pytest.mark.parametrize("tiles", [SMALL, BY_SEGMENT, PAIRS], ids=["small", "by_segment", "pairs"])
def test_threshold_overflow_rows_take_the_exact_slow_path(tiles):
    # Sorted, all-equal and three-valued rows put whole segments (or the whole window) over T.
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 1024, generator=g)
    logits[0] = torch.arange(1024, dtype=torch.float32)
    logits[1] = -3.0
    logits[2] = torch.randint(0, 3, (1024,), generator=g).float()
    starts = torch.tensor([0, 7, 0, 0], dtype=I32)
    ends = torch.tensor([1024, 1000, 1024, 1024], dtype=I32)
    counts = candidate_counts(logits, starts, ends, 16, tiles)
    assert (counts[:3] > tiles.capacity).all() and counts[3] <= tiles.capacity, counts
    _assert_sets(topk(logits, starts, ends, 16, tiles), reference(logits, starts, ends, 16))


@pytest.mark.parametrize("bits", [12, 16])
def test_two_bits_a_round_find_the_same_threshold(bits):
    """search_pairs finds the same T (so the same candidate count) as the one-bit search, at
    any even threshold_bits, and refuses an odd one."""
    rows = _edge_rows(2)
    one = candidate_counts(*rows, 16, replace(SMALL, threshold_bits=bits))
    two = candidate_counts(*rows, 16, replace(PAIRS, threshold_bits=bits))
    torch.testing.assert_close(two, one)
    with pytest.raises(ValueError, match="threshold_bits must be even, got 13"):
        topk(*rows, 16, replace(PAIRS, threshold_bits=13))


def test_threshold_short_and_empty_rows_pad_with_minus_one():
    logits = torch.randn(4, 300)
    starts = torch.tensor([0, 100, 50, 0], dtype=I32)
    ends = torch.tensor([20, 100, 82, 300], dtype=I32)
    got = topk(logits, starts, ends, 32, SMALL)
    assert got[0].tolist() == [*range(20), *([-1] * 12)]
    assert got[1].tolist() == [-1] * 32
    assert got[2].tolist() == list(range(32))  # exactly k columns
    _assert_sets(got[3:], reference(logits[3:], starts[3:], ends[3:], 32))


def test_threshold_short_windows_in_long_rows_keep_fine_segments():
    # M = 32 segments cover a 2048-column row at 64 columns each, which would leave a
    # 300-column window 6 segments (< k: every column a candidate); the window's own level has
    # 16 columns a segment, 20 of them, and about 10 candidates.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 2048, generator=g)
    starts = torch.tensor([1000, 0, 1747], dtype=I32)
    ends = torch.tensor([1300, 2048, 2047], dtype=I32)
    counts = candidate_counts(logits, starts, ends, 8, ThresholdTiles(segments=32, block=64))
    assert (counts >= 8).all() and (counts < 40).all(), counts
    got = topk(logits, starts, ends, 8, ThresholdTiles(segments=32, block=64))
    _assert_sets(got, reference(logits, starts, ends, 8))


def test_threshold_k_one_and_k_over_the_row():
    logits, starts, ends = _edge_rows(4, length=200)
    ends = torch.minimum(ends, torch.tensor(200, dtype=I32))
    starts = torch.minimum(starts, ends)
    for k in (1, 150, 256):
        _assert_sets(topk(logits, starts, ends, k, SMALL), reference(logits, starts, ends, k))


def test_threshold_hands_large_k_to_the_radix_kernel():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4500, generator=g).relu()  # ties at 0 across the k-th rank
    starts = torch.tensor([0, 300], dtype=I32)
    ends = torch.tensor([4500, 4500], dtype=I32)
    k = MAX_K + 1
    _assert_sets(topk(logits, starts, ends, k), reference(logits, starts, ends, k))


def _check_radix(logits, starts, ends, k):
    got = radix_topk(logits, starts, ends, k, block=256, num_warps=4, chunks=3, gather_block=128)
    _assert_sets(got, reference(logits, starts, ends, k))


def test_radix_matches_reference_sets():
    logits, starts, ends = _edge_rows(0)
    _check_radix(logits, starts, ends, 48)


def test_radix_short_and_empty_rows_pad_with_minus_one():
    logits = torch.randn(3, 300)
    starts = torch.tensor([0, 100, 50], dtype=I32)
    ends = torch.tensor([20, 100, 64], dtype=I32)
    got = radix_topk(logits, starts, ends, 32, block=128, num_warps=4, gather_block=128)
    assert got[0].tolist() == [*range(20), *([-1] * 12)]
    assert got[1].tolist() == [-1] * 32
    assert sorted(got[2].tolist()[:14]) == list(range(14)) and got[2, 14:].eq(-1).all()


@pytest.mark.parametrize("impl", ["threshold", "radix"])
def test_equal_scores_take_smallest_indices(impl):
    logits = torch.zeros(1, 1000)
    logits[0, 900:] = 5.0  # 100 clear winners, then 900 ties at 0 for the rest
    starts, ends = torch.tensor([0], dtype=I32), torch.tensor([1000], dtype=I32)
    run = {"threshold": lambda *args: topk(*args, SMALL), "radix": radix_topk}[impl]
    got = run(logits, starts, ends, 128)
    assert sorted(got[0].tolist()) == sorted([*range(900, 1000), *range(28)])
