"""moe.route Triton kernel against the reference (CPU interpreter): ids in the reference's order,
weights within the conformance tolerance, on fresh random inputs with exact ties, E not a power
of two, one-expert groups, no grouping, no bias, bf16 / fp16 logits."""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton.moe_route import MAX_EXPERT_LANES, route
from hwrun.ops.moe_route import route as reference

SEED = torch.seed() % 2**31  # fresh inputs every run, printed on failure through the ids


def _logits(tokens: int, experts: int, seed: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g) * 2
    if ties:
        logits = torch.round(logits * 2) / 2  # ~17 distinct values: ties at every rank
    return logits


def _bias(experts: int, seed: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    bias = torch.rand(experts, generator=g) * 0.1
    return torch.round(bias * 20) / 20 if ties else bias


def _check(logits: torch.Tensor, top_k: int, **options) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = route(logits, top_k, **options)
    want_weights, want_ids = reference(logits, top_k, **options)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids, want_ids), (SEED, options)
    torch.testing.assert_close(weights, want_weights, atol=1e-5, rtol=1e-5)
    return weights, ids


DEEPSEEK = {"scoring": "sigmoid", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "options"),
    [
        (37, 256, 8, DEEPSEEK),  # DeepSeek-V3.2's router
        (9, 96, 6, {"scoring": "sigmoid", "n_group": 8, "topk_group": 3}),  # groups of 12
        (5, 8, 3, {"scoring": "sigmoid", "n_group": 8, "topk_group": 5}),  # one-expert groups
        (11, 20, 4, {"scoring": "softmax"}),  # ungrouped, E not a power of two
        (6, 64, 8, {"scoring": "sigmoid", "n_group": 1, "topk_group": 1}),  # one group
        (4, 32, 8, {"scoring": "softmax", "n_group": 4, "topk_group": 4}),  # every group kept
        (3, 12, 12, {"scoring": "softmax", "renormalize": False}),  # k = E
        (7, 16, 1, {"scoring": "sigmoid", "renormalize": False, "routed_scaling_factor": 0.5}),
    ],
)
def test_matches_the_reference(tokens, experts, top_k, options, ties):
    logits = _logits(tokens, experts, SEED + experts, ties)
    _check(logits, top_k, **options)
    if options["scoring"] == "sigmoid":
        bias = _bias(experts, SEED + experts, ties)
        _check(logits, top_k, e_score_correction_bias=bias, **options)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_scored_in_fp32(dtype):
    logits = _logits(13, 64, SEED, ties=False).to(dtype)
    _check(logits, 8, e_score_correction_bias=_bias(64, SEED, False), **DEEPSEEK)


def test_all_equal_scores_choose_the_first_groups_and_ids():
    """Every choice ties: the smallest group indices, then the smallest ids, in id order."""
    logits = torch.zeros(3, 64)
    _, ids = _check(logits, 8, scoring="sigmoid", n_group=8, topk_group=2)
    assert ids.tolist() == [list(range(8))] * 3
    _, ids = _check(logits, 5, scoring="softmax")
    assert ids.tolist() == [list(range(5))] * 3


def test_group_ties_and_a_group_won_by_its_second_expert():
    """Groups 1 and 2 tie on their top-2 sum (the smaller index wins); group 3 has the best
    expert but the worse sum, so it is dropped."""
    logits = torch.full((1, 16), -4.0)
    logits[0, 4:6] = torch.tensor([1.0, 1.0])  # group 1: sum of two equal values
    logits[0, 8:10] = torch.tensor([1.0, 1.0])  # group 2: the same sum
    logits[0, 12] = 3.0  # group 3: one strong expert, weak second
    _, ids = _check(logits, 2, scoring="sigmoid", n_group=4, topk_group=1, renormalize=False)
    assert ids.tolist() == [[4, 5]]


def test_selection_uses_the_bias_and_weights_do_not():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([10.0, 0.0, 0.0, 0.0])
    weights, ids = _check(logits, 2, scoring="sigmoid", e_score_correction_bias=bias)
    assert ids.tolist() == [[0, 3]]
    raw = torch.sigmoid(torch.tensor([0.0, 3.0]))
    torch.testing.assert_close(weights[0], raw / raw.sum())


def test_strided_logits_and_no_tokens():
    wide = _logits(10, 128, SEED, ties=True)
    _check(wide[::2, 32:96], 6, **{**DEEPSEEK, "n_group": 4, "topk_group": 2})  # [5, 64] view
    _check(wide.t().contiguous().t(), 8, **DEEPSEEK)  # column-major
    weights, ids = route(torch.empty(0, 64), 4, scoring="sigmoid")
    assert weights.shape == ids.shape == (0, 4)


def test_a_token_alone_routes_as_in_a_batch():
    logits = _logits(24, 256, SEED, ties=True)
    bias = _bias(256, SEED, ties=True)
    batch = route(logits, 8, e_score_correction_bias=bias, **DEEPSEEK)
    for row in (0, 7, 23):
        alone = route(logits[row : row + 1], 8, e_score_correction_bias=bias, **DEEPSEEK)
        assert torch.equal(alone[1], batch[1][row : row + 1])
        assert torch.equal(alone[0], batch[0][row : row + 1])  # bitwise


def test_nan_logits_still_give_distinct_ids_in_range():
    """The reference refuses NaN (it reads the logits on the host); the kernel cannot, so it
    must at least never hand moe.experts an id outside 0..E-1."""
    logits = _logits(4, 64, SEED, ties=False)
    logits[0, 5] = float("nan")
    logits[1, :] = float("nan")
    _, ids = route(logits, 8, **DEEPSEEK)
    assert ids.min() >= 0 and ids.max() < 64
    assert all(len(set(row)) == 8 for row in ids.tolist())
    assert ids[0, 0] == 5  # NaN ranks first, as in torch's descending sort


def test_the_tie_inputs_exercise_the_tie_rule():
    """Negative control: on the tied inputs a largest-id-first rule (the reference on mirrored
    experts, mapped back) picks other ids, so the equality checks above can fail."""
    logits = _logits(37, 256, SEED + 256, ties=True)
    _, ids = route(logits, 8, scoring="sigmoid")
    _, mirrored = reference(logits.flip(-1), 8, scoring="sigmoid")
    assert not torch.equal(ids, 255 - mirrored)


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        ((torch.zeros(2, 16), 0), {}, "top_k must be in 1..E"),
        ((torch.zeros(2, 16), 2), {"scoring": "relu"}, "scoring must be one of"),
        ((torch.zeros(2, 16), 2), {"n_group": 3, "topk_group": 1}, "n_group must divide"),
        ((torch.zeros(16), 2), {}, "must be a float tensor [T, E]"),
        ((torch.zeros(1, 2 * MAX_EXPERT_LANES), 2), {}, "register tile"),
    ],
)
def test_refusals_name_the_problem(args, options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        route(*args, **options)
