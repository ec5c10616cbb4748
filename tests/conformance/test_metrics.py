"""The metrics must accept what the contract allows and catch what it forbids."""

from __future__ import annotations

import torch

from hwrun_conformance.metrics import (
    allclose,
    allclose_terms,
    exact,
    index_set,
    logits,
    row_sets,
    structural,
)
from hwrun_conformance.tolerances import EXACT, Tolerance

NEG_INF = float("-inf")


def _topk_value(got, scores, starts, ends) -> float:
    got = torch.tensor(got, dtype=torch.int32)
    return index_set(
        got,
        got,
        EXACT,
        scores=torch.tensor(scores),
        starts=torch.tensor(starts),
        ends=torch.tensor(ends),
    ).value


def test_topk_tie_rule_accepts_any_tied_choice_and_rejects_worse_ones() -> None:
    scores = [[3.0, 0.0, 0.0, 0.0, 5.0]]
    assert _topk_value([[4, 0, 1]], scores, [0], [5]) == 0  # one of three tied zeros
    assert _topk_value([[0, 3, 4]], scores, [0], [5]) == 0  # another, any order
    assert _topk_value([[4, 1, 1]], scores, [0], [5]) == 1  # duplicate
    assert _topk_value([[4, 1, 2]], scores, [0], [5]) == 1  # misses the 3.0
    assert _topk_value([[4, 0, 5]], scores, [0], [5]) == 1  # out of range


def test_topk_short_rows_need_every_column_then_minus_one() -> None:
    scores = [[9.0, 1.0, 2.0, 9.0], [1.0, 2.0, 3.0, 4.0]]
    starts, ends = [1, 2], [3, 2]  # row 0 has columns 1..2 (relative 0, 1); row 1 is empty
    assert _topk_value([[1, 0, -1], [-1, -1, -1]], scores, starts, ends) == 0
    assert _topk_value([[1, -1, -1], [-1, -1, -1]], scores, starts, ends) == 1
    assert _topk_value([[1, 0, 2], [-1, -1, -1]], scores, starts, ends) == 1  # past the end


def test_logits_need_exact_minus_inf_positions() -> None:
    ref = torch.tensor([[1.0, 2.0, NEG_INF]])
    assert logits(ref + 1e-7, ref, EXACT).value < 1e-10
    moved = torch.tensor([[1.0, NEG_INF, 3.0]])
    assert logits(moved, ref, EXACT).value == float("inf")
    assert logits(ref * 1.01, ref, EXACT).value > 1e-5


def test_allclose_ratio_and_nonfinite_positions() -> None:
    tol = Tolerance(1.0, atol=1e-3, rtol=0.0)
    ref = torch.tensor([0.0, 1.0, NEG_INF])
    assert 0.4 < allclose(ref + 5e-4, ref, tol).value < 1
    assert allclose(ref + 2e-3, ref, tol).value > 1
    assert allclose(torch.tensor([0.0, 1.0, 0.0]), ref, tol).value == float("inf")


def test_allclose_terms_judges_a_cancelling_sum_by_its_terms() -> None:
    """A GEMM output of -0.25 summed from terms of size ~2e4 (the scale_extremes case): an
    error of 6, 2^-12 of the terms (fp8 tensor-core accumulation), passes; the same error
    against an output whose terms are as small as itself fails, as does a wrong-scale error
    of the terms' own size."""
    tol = Tolerance(1.0, atol=1e-2, rtol=1e-2, terms=2**-10)
    ref = torch.tensor([-0.25, 100.0, NEG_INF])
    terms = torch.tensor([2.5e4, 100.0, 0.0])
    got = torch.tensor([6.0, 100.5, NEG_INF])
    assert 0.1 < allclose_terms(got, ref, tol, terms=terms).value < 1
    assert allclose(got, ref, tol).value > 100  # the plain metric calls it wrong
    assert allclose_terms(got, ref, tol, terms=torch.tensor([0.3, 100.0, 0.0])).value > 1
    wrong_scale = torch.tensor([-0.25 + 2.5e4 / 16, 100.0, NEG_INF])
    assert allclose_terms(wrong_scale, ref, tol, terms=terms).value > 1
    inf_moved = torch.tensor([-0.25, 100.0, 0.0])
    assert allclose_terms(inf_moved, ref, tol, terms=terms).value == float("inf")


def test_exact_counts_differing_bytes_and_structure_checks() -> None:
    ref = torch.arange(8, dtype=torch.uint8)
    got = ref.clone()
    got[3] ^= 0x10
    assert exact(got, ref, EXACT).value == 1
    assert structural(ref.float(), ref) is not None  # dtype
    assert structural(torch.tensor([float("nan")]), torch.tensor([0.0])) is not None
    assert row_sets(torch.tensor([[2, 1]]), torch.tensor([[1, 2]]), EXACT).value == 0
    assert row_sets(torch.tensor([[2, 3]]), torch.tensor([[1, 2]]), EXACT).value == 1
