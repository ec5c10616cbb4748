"""indexer.topk and indexer.to_slots: order rule, short rows, -inf, errors, brute-force oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.ops.topk import to_slots, topk

INF = float("inf")


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _brute_force(row: list[float], start: int, end: int, k: int) -> list[int]:
    """The documented order, written as a plain sort key."""

    def key(j: int):
        v = row[j]
        low = v != v or v == -INF  # NaN and -inf come after every other score
        return (low, 0.0 if low else -v, j)

    best = sorted(range(start, end), key=key)[:k]
    return [j - start for j in best] + [-1] * (k - len(best))


def test_order_is_score_then_smallest_index():
    logits = torch.tensor([[1.0, 3.0, 3.0, -INF, 2.0, 0.0, 3.0]])
    out = topk(logits, _i32([0]), _i32([7]), 4)
    assert out.tolist() == [[1, 2, 6, 4]]
    assert out.dtype == torch.int32


def test_indices_are_relative_to_the_row_start_and_short_rows_pad_with_minus_one():
    logits = torch.tensor([[9.0, 1.0, 5.0, 7.0, 3.0]] * 3)
    out = topk(logits, _i32([0, 2, 3]), _i32([5, 4, 3]), 3)
    assert out.tolist() == [[0, 3, 2], [1, 0, -1], [-1, -1, -1]]


def test_k_larger_than_the_row_width():
    logits = torch.tensor([[0.5, 0.25, 1.0]])
    assert topk(logits, _i32([0]), _i32([3]), 6).tolist() == [[2, 0, 1, -1, -1, -1]]


def test_minus_inf_inside_the_range_comes_after_finite_scores_then_by_index():
    logits = torch.tensor([[-INF, -5.0, -INF, float("nan"), -7.0, 1.0]])
    out = topk(logits, _i32([0]), _i32([6]), 6)
    assert out.tolist() == [[5, 1, 4, 0, 2, 3]]


def test_signed_zeros_tie_by_index():
    # ReLU scores make exact zeros the common tie; -0.0 must not beat an earlier +0.0.
    logits = torch.tensor([[0.0, -0.0, 0.0, -0.0, 2.0]])
    assert topk(logits, _i32([0]), _i32([5]), 3).tolist() == [[4, 0, 1]]


def test_nothing_outside_the_range_is_ever_selected():
    logits = torch.tensor([[100.0, 1.0, 2.0, 100.0]])
    assert topk(logits, _i32([1]), _i32([3]), 4).tolist() == [[1, 0, -1, -1]]


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    width=st.integers(1, 24),
    k=st.integers(1, 30),
)
def test_matches_brute_force(data, width, k):
    # A small alphabet of values makes ties, zeros and -inf frequent.
    alphabet = st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0, -INF, float("nan"), 7.0])
    rows = data.draw(st.integers(1, 4))
    values = [[data.draw(alphabet) for _ in range(width)] for _ in range(rows)]
    starts, ends = [], []
    for _ in range(rows):
        a = data.draw(st.integers(0, width))
        starts.append(a)
        ends.append(data.draw(st.integers(a, width)))
    out = topk(torch.tensor(values), _i32(starts), _i32(ends), k)
    for r in range(rows):
        assert out[r].tolist() == _brute_force(values[r], starts[r], ends[r], k)


@pytest.mark.parametrize(
    ("logits", "starts", "ends", "k", "message"),
    [
        (torch.zeros(2, 4), [0, 0], [4, 4], 0, "k must be a positive int"),
        (torch.zeros(2, 4), [0, 0], [4, 4], -3, "k must be a positive int"),
        (torch.zeros(2, 4, dtype=torch.bfloat16), [0, 0], [4, 4], 2, "float32"),
        (torch.zeros(4), [0], [4], 2, "float32 \\[R, L\\]"),
        (torch.zeros(2, 4), [0], [4], 2, "starts must be an int32 tensor of shape \\[2\\]"),
        (torch.zeros(2, 4), [0, 0], [4, 5], 2, "end <= L=4"),
        (torch.zeros(2, 4), [0, 3], [4, 2], 2, "start <= end"),
        (torch.zeros(2, 4), [-1, 0], [4, 4], 2, "0 <= start"),
    ],
)
def test_bad_input_says_what_was_expected(logits, starts, ends, k, message):
    with pytest.raises(ValueError, match=message):
        topk(logits, _i32(starts), _i32(ends), k)


def test_float_bounds_are_refused():
    with pytest.raises(ValueError, match="int32"):
        topk(torch.zeros(1, 4), torch.zeros(1), _i32([4]), 2)


TABLE = _i32([[3, 1, -1], [0, 2, 5]])


def test_to_slots_maps_through_the_block_table():
    indices = _i32([[0, 5, -1], [3, 7, 1], [0, -1, 9], [-1, -1, -1]])
    out = to_slots(indices, TABLE, 4)
    # rows 0-1 belong to request 0 (blocks 3, 1), rows 2-3 to request 1 (blocks 0, 2, 5)
    assert out.tolist() == [[12, 5, -1], [15, 7, 13], [0, -1, 21], [-1, -1, -1]]
    assert out.dtype == torch.int32


def test_to_slots_with_an_explicit_request_per_row():
    indices = _i32([[1, 2], [1, 2], [4, 0]])
    out = to_slots(indices, TABLE, 4, request_of_row=_i32([1, 0, 0]))
    assert out.tolist() == [[1, 2], [13, 14], [4, 12]]


@pytest.mark.parametrize(
    ("indices", "kwargs", "message"),
    [
        ([[0, -2], [0, 0]], {}, "never another negative"),
        ([[0, 12], [0, 0]], {}, "past the block table"),
        ([[8], [0]], {}, "unallocated"),
        ([[0]] * 3, {}, "multiple of B=2"),
        ([[0]], {"request_of_row": _i32([2])}, "request_of_row must lie in"),
        ([[0]], {"block_size": 0}, "block_size must be a positive int"),
    ],
)
def test_to_slots_bad_input(indices, kwargs, message):
    kwargs = {"block_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        to_slots(_i32(indices), TABLE, **kwargs)
