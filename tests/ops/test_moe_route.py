"""moe.route against transformers' DeepseekV32 router, plus its tie rule and edge cases."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DeepseekV32Config
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32TopkRouter

from hwrun.ops.moe_route import route


def hf_router(hidden, experts, top_k, n_group, topk_group, scaling, seed):
    config = DeepseekV32Config(
        hidden_size=hidden,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=scaling,
        norm_topk_prob=True,
    )
    router = DeepseekV32TopkRouter(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, hidden, generator=generator))
        router.e_score_correction_bias.copy_(torch.randn(experts, generator=generator) * 0.5)
    return router


def by_id(ids, weights):
    """Rows sorted by expert id: transformers' top-k order is unspecified (sorted=False)."""
    order = ids.long().argsort(dim=-1)
    return ids.long().gather(1, order), weights.gather(1, order)


@pytest.mark.parametrize(
    ("experts", "top_k", "n_group", "topk_group"),
    [(16, 4, 4, 2), (32, 6, 8, 3), (12, 3, 1, 1), (8, 8, 2, 2)],
)
def test_matches_transformers_deepseek_v32_router(experts, top_k, n_group, topk_group):
    hidden, tokens = 24, 37
    router = hf_router(hidden, experts, top_k, n_group, topk_group, scaling=2.5, seed=experts)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    weights, ids = route(
        logits,
        top_k,
        scoring="sigmoid",
        n_group=n_group,
        topk_group=topk_group,
        e_score_correction_bias=router.e_score_correction_bias,
        routed_scaling_factor=2.5,
    )
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (tokens, top_k)
    ours_ids, ours_w = by_id(ids, weights)
    hf_ids_sorted, hf_w = by_id(hf_ids, hf_weights)
    assert torch.equal(ours_ids, hf_ids_sorted)
    torch.testing.assert_close(ours_w, hf_w, rtol=1e-6, atol=1e-7)


def test_softmax_plain_top_k_and_ordering():
    logits = torch.randn(50, 10, generator=torch.Generator().manual_seed(3))
    weights, ids = route(logits, 3, scoring="softmax", renormalize=False)
    probs = torch.softmax(logits, dim=-1)
    expected = torch.topk(probs, 3, dim=-1)  # sorted, and random floats have no ties
    assert torch.equal(ids.long(), expected.indices)
    torch.testing.assert_close(weights, expected.values)
    renormalized, _ = route(logits, 3, routed_scaling_factor=2.0)
    torch.testing.assert_close(renormalized.sum(-1), torch.full((50,), 2.0))


def test_weights_come_from_unbiased_scores():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([10.0, 0.0, 0.0, 0.0])  # expert 0 is chosen only thanks to the bias
    weights, ids = route(logits, 2, "sigmoid", e_score_correction_bias=bias, renormalize=False)
    assert ids.tolist() == [[0, 3]]
    torch.testing.assert_close(weights, torch.sigmoid(torch.tensor([[0.0, 3.0]])))


def test_ties_pick_the_smaller_expert_id_and_group():
    weights, ids = route(torch.zeros(3, 8), 3)
    assert ids.tolist() == [[0, 1, 2]] * 3
    torch.testing.assert_close(weights, torch.full((3, 3), 1 / 3))
    # Experts 1 and 6 tie at the top; groups {0,1}, {2,3}, {4,5}, {6,7}: groups 0 and 3 tie.
    logits = torch.tensor([[0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0]])
    _, ids = route(logits, 1, "sigmoid", n_group=4, topk_group=1)
    assert ids.tolist() == [[1]]
    _, ids = route(logits, 2, "sigmoid", n_group=4, topk_group=2)
    assert ids.tolist() == [[1, 6]]
    _, ids = route(logits, 2, "sigmoid", n_group=4, topk_group=1)  # both from group 0
    assert ids.tolist() == [[1, 0]]


def test_a_row_routes_the_same_alone_and_in_a_batch():
    logits = torch.randint(-2, 3, (64, 16)).float()  # many exact ties
    bias = torch.randint(-1, 2, (16,)).float()
    args = {"scoring": "sigmoid", "n_group": 4, "topk_group": 2, "e_score_correction_bias": bias}
    weights, ids = route(logits, 4, **args)
    for row in (0, 17, 63):
        w_one, ids_one = route(logits[row : row + 1], 4, **args)
        assert torch.equal(ids_one, ids[row : row + 1])
        assert torch.equal(w_one, weights[row : row + 1])


def test_topk_group_equal_to_n_group_is_plain_top_k():
    logits = torch.randn(20, 12, generator=torch.Generator().manual_seed(5))
    bias = torch.randn(12, generator=torch.Generator().manual_seed(6))
    grouped = route(logits, 5, "sigmoid", n_group=3, topk_group=3, e_score_correction_bias=bias)
    plain = route(logits, 5, "sigmoid", e_score_correction_bias=bias)
    assert torch.equal(grouped[1], plain[1]) and torch.equal(grouped[0], plain[0])


def test_single_expert():
    logits = torch.tensor([[-3.0], [0.5]])
    weights, ids = route(logits, 1, "sigmoid", routed_scaling_factor=2.5)
    assert ids.tolist() == [[0], [0]]
    torch.testing.assert_close(weights, torch.full((2, 1), 2.5))
    weights, _ = route(logits, 1, "sigmoid", renormalize=False)
    torch.testing.assert_close(weights, torch.sigmoid(logits))


def test_zero_tokens():
    weights, ids = route(torch.empty(0, 16), 4, "sigmoid", n_group=4, topk_group=2)
    assert weights.shape == ids.shape == (0, 4)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32


def test_underflowed_sigmoid_scores_give_zero_weights_not_nan():
    weights, ids = route(torch.full((1, 4), -200.0), 2, "sigmoid")
    assert ids.tolist() == [[0, 1]] and weights.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize(
    ("logits", "kwargs", "message"),
    [
        (torch.zeros(4), {"top_k": 1}, "[T, E]"),
        (torch.zeros(2, 4, dtype=torch.int64), {"top_k": 1}, "[T, E]"),
        (torch.zeros(2, 4), {"top_k": 0}, "top_k must be in 1..E = 1..4"),
        (torch.zeros(2, 4), {"top_k": 5}, "top_k must be in 1..E = 1..4"),
        (torch.zeros(2, 4), {"top_k": 1, "scoring": "relu"}, "scoring must be one of"),
        (torch.zeros(2, 4), {"top_k": 1, "n_group": 2}, "n_group and topk_group go together"),
        (torch.zeros(2, 6), {"top_k": 1, "n_group": 4, "topk_group": 1}, "n_group must divide"),
        (torch.zeros(2, 8), {"top_k": 1, "n_group": 4, "topk_group": 5}, "topk_group must be"),
        (torch.zeros(2, 8), {"top_k": 5, "n_group": 4, "topk_group": 2}, "exceeds the 4 experts"),
        (
            torch.zeros(2, 8),
            {"top_k": 1, "e_score_correction_bias": torch.zeros(7)},
            "e_score_correction_bias must be a float tensor [E] = [8]",
        ),
        (torch.tensor([[0.0, float("nan")]]), {"top_k": 1}, "NaN"),
    ],
)
def test_bad_input_names_what_was_expected(logits, kwargs, message):
    with pytest.raises(ValueError, match=r"moe\.route") as err:
        route(logits, **kwargs)
    assert message in str(err.value)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(0, 6),
    n_group=st.sampled_from([1, 2, 4]),
    group_size=st.integers(1, 5),
    data=st.data(),
)
def test_ids_are_distinct_and_inside_the_chosen_groups(tokens, n_group, group_size, data):
    experts = n_group * group_size
    topk_group = data.draw(st.integers(1, n_group))
    top_k = data.draw(st.integers(1, topk_group * group_size))
    seed = data.draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (tokens, experts), generator=generator).float()
    bias = torch.randint(-1, 2, (experts,), generator=generator).float() / 4
    weights, ids = route(logits, top_k, "sigmoid", n_group, topk_group, bias, True, 1.5)
    for row in range(tokens):
        chosen = ids[row].tolist()
        assert len(set(chosen)) == top_k
        assert len({e // group_size for e in chosen}) <= topk_group
    torch.testing.assert_close(weights.sum(-1), torch.full((tokens,), 1.5))
