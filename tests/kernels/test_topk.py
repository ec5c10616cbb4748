"""indexer.topk Triton kernels against the reference, in the CPU interpreter: the threshold
kernel (the registered one) and the radix kernel it hands k > MAX_K to."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from hwrun.kernels.triton import topk_threshold
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.topk import topk as radix_topk
from hwrun.kernels.triton.topk_select import kth_largest, kth_largest_radix
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
RADIX = ThresholdTiles(
    segments=32, capacity=128, block=256, compact_block=64, chunks=3, radix_search=True
)
RADIX4 = replace(RADIX, radix_bits=4)  # 16-bin histograms, twice the rounds
# The bitwise search to the end (the default stops at exactly k keys: early_exit).
FULL_SEARCH = replace(BY_SEGMENT, early_exit=False)
# T searched by _segment_max's last program of each row (no _threshold launch).
FOLDED = replace(BY_SEGMENT, fold_threshold=True)
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
    [SMALL, TINY_CAPACITY, BY_SEGMENT, PAIRS, RADIX, RADIX4, FULL_SEARCH, FOLDED],
    ids=["small", "tiny_capacity", "by_segment", "pairs", "radix", "radix4", "full_search",
         "folded"],
)  # fmt: skip
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


@pytest.mark.parametrize(
    "tiles",
    [SMALL, BY_SEGMENT, PAIRS, RADIX, FULL_SEARCH, FOLDED],
    ids=["small", "by_segment", "pairs", "radix", "full_search", "folded"],
)
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


@pytest.mark.parametrize(
    "tiles",
    [FOLDED, replace(FOLDED, by_segment=False)],
    ids=["by_segment", "scan"],
)
def test_folded_threshold_is_the_launched_one(monkeypatch, tiles):
    """_segment_max's last program of a row finds the T (so the candidates) that the _threshold
    launch finds, on rows whose programs mostly skip (short windows in long rows, short rows),
    and leaves the arrival counters zero for the next call (every call after the first relies
    on it), also when a call has more rows than the counters were made for."""
    monkeypatch.setattr(topk_threshold, "_ARRIVALS", {})
    monkeypatch.setattr(topk_threshold, "_ARRIVAL_ROWS", 4)  # made for 4 rows, then for 9
    unfolded = replace(tiles, fold_threshold=False)
    for rows in ([t[:4] for t in _edge_rows(4)], _edge_rows(5)):
        want = candidate_counts(*rows, 16, unfolded)
        torch.testing.assert_close(candidate_counts(*rows, 16, tiles), want)
        _assert_sets(topk(*rows, 16, tiles), reference(*rows, 16))
    made = topk_threshold._ARRIVALS[torch.device("cpu")]
    assert [c.numel() for c in made] == [4, 9] and not any(c.any() for c in made)


def test_early_exit_keeps_a_valid_threshold():
    """The search that stops at exactly k maxima may leave T lower (never higher: more
    candidates, never fewer) than the search to the end, and both select the same sets."""
    rows = _edge_rows(3)
    early, full = (candidate_counts(*rows, 16, t) for t in (BY_SEGMENT, FULL_SEARCH))
    assert (early >= full).all(), (early, full)
    _assert_sets(topk(*rows, 16, BY_SEGMENT), topk(*rows, 16, FULL_SEARCH))


@pytest.mark.parametrize("bits", [12, 16])
def test_two_bits_a_round_find_the_same_threshold(bits):
    """search_pairs finds the same T (so the same candidate count) as the one-bit search to the
    end, at any even threshold_bits, and refuses an odd one."""
    rows = _edge_rows(2)
    one = candidate_counts(*rows, 16, replace(SMALL, threshold_bits=bits, early_exit=False))
    two = candidate_counts(*rows, 16, replace(PAIRS, threshold_bits=bits))
    torch.testing.assert_close(two, one)
    with pytest.raises(ValueError, match="threshold_bits must be even, got 13"):
        topk(*rows, 16, replace(PAIRS, threshold_bits=13))


def test_radix_search_finds_the_same_threshold():
    """radix_search finds the bitwise search's T (so the same candidate count), and refuses
    threshold_bits that are not whole bytes and the two-bit search (other whole bytes: the
    direct test of kth_largest_radix below)."""
    rows = _edge_rows(2)
    one = candidate_counts(*rows, 16, replace(SMALL, early_exit=False))
    torch.testing.assert_close(candidate_counts(*rows, 16, RADIX), one)
    torch.testing.assert_close(candidate_counts(*rows, 16, RADIX4), one)
    torch.testing.assert_close(candidate_counts(*rows, 16, replace(RADIX4, threshold_bits=12)),
                               candidate_counts(*rows, 16, replace(SMALL, threshold_bits=12,
                                                                   early_exit=False)))  # fmt: skip
    with pytest.raises(ValueError, match="threshold_bits=12, search_pairs=False"):
        topk(*rows, 16, replace(RADIX, threshold_bits=12))
    with pytest.raises(ValueError, match="threshold_bits=16, search_pairs=True"):
        topk(*rows, 16, replace(RADIX, search_pairs=True))
    with pytest.raises(ValueError, match="radix_bits=2"):
        topk(*rows, 16, replace(RADIX, radix_bits=2))


@pytest.mark.parametrize(
    "tiles",
    [
        ThresholdTiles(segments=1024, capacity=1024, block=1024, compact_block=256, **flags)
        for flags in ({"radix_search": True}, {"radix_search": True, "radix_bits": 4},
                      {"early_exit": True}, {"early_exit": False})
    ],
    ids=["radix", "radix4", "early_exit", "full_search"],
)  # fmt: skip
def test_fresh_rows(tiles):
    """Longer rows than the edge rows, in windows that start and end off every tile: scores of
    both signs, negative only, crowded in one top byte (T and the largest candidate share it,
    so select_candidates copies that round), and ties at the k-th score that the index cuts."""
    g = torch.Generator().manual_seed(7)
    length = 8192
    logits = torch.randn(4, length, generator=g)
    logits[1] = -logits[1].abs() - 0.5
    logits[2] = 1.0 + torch.rand(length, generator=g)  # every key's top byte is 0xBF
    logits[3] = torch.round(logits[3] * 4)
    starts = torch.tensor([3, 0, 1001, 17], dtype=I32)
    ends = torch.tensor([8190, 8192, 7777, 6000], dtype=I32)
    counts = candidate_counts(logits, starts, ends, 256, tiles)
    assert (counts <= tiles.capacity // 2).all(), counts  # the half tile, in every row
    _assert_sets(topk(logits, starts, ends, 256, tiles), reference(logits, starts, ends, 256))


@triton.jit
def _both_searches(
    keys_ptr, bounds_ptr, out_ptr, k, N: tl.constexpr, BITS: tl.constexpr, DIGIT: tl.constexpr
):
    keys = tl.load(keys_ptr + tl.arange(0, N)).to(tl.uint32, bitcast=True)
    lo = tl.load(bounds_ptr).to(tl.uint32, bitcast=True)
    hi = tl.load(bounds_ptr + 1).to(tl.uint32, bitcast=True)
    bitwise = kth_largest(keys, k, lo, hi, BITS, False)
    radix, need, ties = kth_largest_radix(keys, k, lo, hi, BITS, DIGIT)
    tl.store(out_ptr, bitwise.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 1, radix.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 2, need)
    tl.store(out_ptr + 3, ties)


def _crowded_keys(rng, n):
    """uint32 key sets [n] that put the k-th key's digits in one crowded bin."""
    uniform = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    one_byte = 0xBF000000 | rng.integers(0, 1 << 24, n, dtype=np.uint64)
    # top bytes 0xBE and 0xBF: a lo and hi whose bytes differ in the last bit only
    neighbour_bytes = 0xBE000000 | rng.integers(0, 1 << 25, n, dtype=np.uint64)
    two_bytes = 0xC3A50000 | rng.integers(0, 1 << 16, n, dtype=np.uint64)
    two_bytes[:5] = 0xFFFF0000  # a few keys above the crowd, in another top byte
    repeated = rng.choice(np.array([0x007FFFFF, 0x80000000, 0xC0000000, 0xC0000001]), n)
    return {
        "uniform": uniform,
        "one_byte": one_byte,
        "neighbour_bytes": neighbour_bytes,
        "two_bytes": two_bytes,
        "repeated": repeated,
    }


@pytest.mark.parametrize("digit", [4, 8])
@pytest.mark.parametrize("bits", [8, 16, 32])
def test_kth_largest_radix_equals_the_bitwise_search(bits, digit):
    """kth_largest_radix gives kth_largest's v (the k-th key with the bits below BITS cleared)
    and the counts at v, with lo and hi as _threshold passes them (0, all ones) and as
    select_candidates does (a lower bound with 16 bits, the largest key)."""
    rng = np.random.default_rng(bits)
    n = 1024
    prepare_launch()
    for name, keys in _crowded_keys(rng, n).items():
        descending = np.sort(keys)[::-1]
        top = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF
        for k in (1, 37, 300, n):
            v = int(descending[k - 1]) & top
            need = k - int(((keys & top) > v).sum())
            ties = int(((keys & top) == v).sum())
            lower = int(descending[min(2 * k, n) - 1]) & 0xFFFF0000
            for lo, hi in ((0, 0xFFFFFFFF), (lower, int(descending[0]))):
                out = torch.empty(4, dtype=I32)
                _both_searches[(1,)](
                    torch.from_numpy(keys.astype(np.uint32).view(np.int32)),
                    torch.from_numpy(np.array([lo, hi], dtype=np.uint32).view(np.int32)),
                    out,
                    k,
                    n,
                    bits,
                    digit,
                )
                got = out.numpy().view(np.uint32).tolist()
                case = f"{name} k={k} lo={lo:#x} hi={hi:#x}"
                assert got[0] == got[1] == v, case
                assert (out[2].item(), out[3].item()) == (need, ties), case


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


# M = 256 maxima vote for T (k = 16 needs only 64) and SLACK = M/64 = 4 segments past them are
# compacted: windows of 4M + 1 to 4M + 16 = 1040 columns keep level 2 (4-column segments), the
# last 1 to 16 columns their tail; 1041 columns take level 3.
SLACKED = ThresholdTiles(segments=256, capacity=128, block=256, compact_block=64, chunks=3)


def _slack_rows(seed):
    """2048-column rows, windows around M + SLACK segments of SLACKED (k = 16), five of them
    with the largest scores in the tail (the window's last columns)."""
    g = torch.Generator().manual_seed(seed)
    windows = {
        "M segments of 4 columns": (0, 1024),
        "M + 1: a tail of one column": (0, 1025),
        "M + SLACK, the top k all in the tail": (0, 1040),
        "M + SLACK + 1: 8-column segments": (0, 1041),
        "M + SLACK, short in a padded row": (900, 1938),
        "M + SLACK, unaligned start, the top k but one in the tail": (901, 1939),
        "M + SLACK + 1, unaligned start": (903, 1941),
        "M + 2 single columns, the top 2 in the tail": (0, 258),
        "M + SLACK of 2 columns, unaligned start, the top 7 in the tail": (7, 525),
        "exactly k columns": (0, 16),
        "fewer than k columns": (5, 15),
        "ties at the k-th key in the head and the tail": (0, 1040),
        "all equal but the tail: the slow path": (0, 1040),
        "the whole row, M segments of 8 columns": (0, 2048),
    }
    logits = torch.randn(len(windows), 2048, generator=g)
    logits[2, 1024:1040] = 10.0 + torch.arange(16.0)
    logits[5, 1924:1939] = 10.0 + torch.arange(15.0)
    logits[7, 256:258] = 10.0 + torch.arange(2.0)
    logits[8, 518:525] = 10.0 + torch.arange(7.0)
    logits[11, [100, 500, *range(1024, 1040)]] = 5.0
    logits[11, 1030] = 6.0  # and 15 of the 17 left at 5.0, by smallest index
    logits[12] = 0.5
    logits[12, 1030:1040] = 1.0
    starts, ends = torch.tensor(list(windows.values()), dtype=I32).T.contiguous()
    return logits, starts, ends, list(windows)


@pytest.mark.parametrize(
    "tiles",
    [SLACKED, replace(SLACKED, by_segment=False), replace(SLACKED, early_exit=False),
     replace(SLACKED, radix_search=True), replace(SLACKED, fold_threshold=True)],
    ids=["by_segment", "scan", "full_search", "radix", "folded"],
)  # fmt: skip
def test_slack_segments_are_compacted(tiles):
    """Windows whose segments run past M: the tail's maxima do not vote for T, but its columns
    are candidates (a dropped tail loses the rows whose top k lie there), at every level, in
    short windows of padded rows, from unaligned starts and on the slow path; and rows whose
    whole width is M + SLACK segments of the last level."""
    logits, starts, ends, names = _slack_rows(9)
    counts = candidate_counts(logits, starts, ends, 16, tiles)
    short = [names.index("exactly k columns"), names.index("fewer than k columns")]
    slow = names.index("all equal but the tail: the slow path")
    assert (counts[short] == 0).all() and counts[slow] > tiles.capacity, counts
    fast = [r for r in range(len(names)) if r not in (*short, slow)]
    assert (counts[fast] >= 16).all() and (counts[fast] <= tiles.capacity).all(), counts
    got, want = topk(logits, starts, ends, 16, tiles), reference(logits, starts, ends, 16)
    for r, name in enumerate(names):
        assert sorted(got[r].tolist()) == sorted(want[r].tolist()), name
    g = torch.Generator().manual_seed(10)
    whole = torch.randn(2, 1040, generator=g)
    whole[:, 1030:1040] = 10.0 + torch.arange(10.0)
    starts, ends = torch.tensor([0, 3], dtype=I32), torch.tensor([1040, 1040], dtype=I32)
    _assert_sets(topk(whole, starts, ends, 16, tiles), reference(whole, starts, ends, 16))


@pytest.mark.parametrize("by_segment", [True, False], ids=["by_segment", "scan"])
def test_windows_just_past_m_segments_keep_the_finer_level(by_segment):
    """4M + 14 columns (M + SLACK segments of 4) keep level 2 where 4M + 17 take level 3. The
    row's 32 largest scores are 16 pairs 4 columns apart, two 4-column segments' maxima but one
    8-column segment's: at level 2 T is the 16th of the 32 and the candidates are the 16 above
    it, as in the row cut to 4M columns; at level 3 T is the smallest pair's larger score and
    31 or more columns reach it."""
    tiles = replace(SLACKED, by_segment=by_segment)
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(1, 1041, generator=g).repeat(3, 1)
    pair = torch.arange(16) * 64
    logits[:, pair] = 10.0 + 2 * torch.arange(16.0)
    logits[:, pair + 4] = 11.0 + 2 * torch.arange(16.0)
    starts = torch.zeros(3, dtype=I32)
    ends = torch.tensor([1024, 1038, 1041], dtype=I32)
    counts = candidate_counts(logits, starts, ends, 16, tiles)
    assert counts[0] == counts[1] == 16 and counts[2] >= 31, counts
    _assert_sets(topk(logits, starts, ends, 16, tiles), reference(logits, starts, ends, 16))


@pytest.mark.parametrize("tiles", [SMALL, RADIX], ids=["small", "radix"])
def test_threshold_k_one_and_k_over_the_row(tiles):
    logits, starts, ends = _edge_rows(4, length=200)
    ends = torch.minimum(ends, torch.tensor(200, dtype=I32))
    starts = torch.minimum(starts, ends)
    for k in (1, 150, 256):
        _assert_sets(topk(logits, starts, ends, k, tiles), reference(logits, starts, ends, k))


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


@pytest.mark.parametrize(
    "impl", ["threshold", "threshold_radix_search", "threshold_full_search", "radix"]
)
def test_equal_scores_take_smallest_indices(impl):
    logits = torch.zeros(1, 1000)
    logits[0, 900:] = 5.0  # 100 clear winners, then 900 ties at 0 for the rest
    starts, ends = torch.tensor([0], dtype=I32), torch.tensor([1000], dtype=I32)
    run = {
        "threshold": lambda *args: topk(*args, SMALL),
        "threshold_radix_search": lambda *args: topk(*args, RADIX),
        "threshold_full_search": lambda *args: topk(*args, FULL_SEARCH),
        "radix": radix_topk,
    }[impl]
    got = run(logits, starts, ends, 128)
    assert sorted(got[0].tolist()) == sorted([*range(900, 1000), *range(28)])


@pytest.mark.parametrize("launches", [False, True], ids=["declines", "launches"])
def test_vendor_kernels_stand_in_where_they_say_so(launches):
    """TopkKernels: each hook is called with the launch's arguments where the tiles are the
    forms it implements (the early-exit bitwise search; for T also by_segment and no fold),
    and the Triton
    kernel runs where it returns False. A hook that launches the Triton kernel itself must give
    the same result as no hook."""
    from hwrun.kernels.triton.topk_select import select_candidates

    calls = []

    def threshold(rows, seg_max, outputs, L, k, M, slack, levels, bits):
        calls.append(("threshold", M, slack, bits))
        if launches:
            topk_threshold._threshold[(seg_max.shape[0],)](
                *rows, seg_max, *outputs, L, k, M, slack, levels, bits, True, False, False,
                True, 8,
            )  # fmt: skip
        return launches

    def select(logits, rows, thresh, counts, cand, out, L, k, cap, idx_bits, block, k_block):
        calls.append(("select", cap, idx_bits))
        if launches:
            select_candidates[(logits.shape[0],)](
                logits, *rows, thresh, counts, cand[0], cand[1], out, logits.stride(0), L, k,
                cap, idx_bits, block, k_block, False, False, True, 8,
            )  # fmt: skip
        return launches

    def compact(logits, rows, live, nlive, thresh, counts, cand, L, k, M, slack, levels, cap,
                block, parts):  # fmt: skip
        calls.append(("compact", block, parts))
        if launches:
            topk_threshold._compact_live[(logits.shape[0], parts)](
                logits, *rows, live, nlive, thresh, counts, cand[0], cand[1], logits.stride(0),
                L, k, M, slack, levels, cap, block,
            )  # fmt: skip
        return launches

    kernels = topk_threshold.TopkKernels(threshold, select, compact)
    rows = _edge_rows(6)
    _assert_sets(topk(*rows, 16, BY_SEGMENT, kernels=kernels), reference(*rows, 16))
    want = [("threshold", 64, 1, 16), ("compact", 64, 3), ("select", 128, 11)]
    assert calls == want, calls
    calls.clear()
    # searches the hooks do not implement: only the compaction is stood in for
    for tiles in (PAIRS, RADIX):
        _assert_sets(topk(*rows, 16, tiles, kernels=kernels), reference(*rows, 16))
    assert [call[0] for call in calls] == ["compact", "compact"], calls
    calls.clear()
    # folded, T is searched inside _segment_max: the compaction and the select are
    _assert_sets(topk(*rows, 16, FOLDED, kernels=kernels), reference(*rows, 16))
    assert calls == [("compact", 64, 3), ("select", 128, 11)], calls
    calls.clear()
    _assert_sets(topk(*rows, 16, SMALL, kernels=kernels), reference(*rows, 16))  # column scan
    assert calls == [("select", 128, 11)], calls
