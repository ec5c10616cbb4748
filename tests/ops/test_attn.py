"""attn.lse_combine: split attention merged by LSE equals attention over all keys."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.ops.attn import lse_combine

INF = float("inf")


def _attend(q, keys, values):  # q [R, D], keys [n, D], values [n, Dv]
    scores = q @ keys.T
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ values, lse


def test_merging_splits_equals_attention_over_all_keys():
    gen = torch.Generator().manual_seed(0)
    q, keys, values = (torch.randn(s, generator=gen) for s in ((5, 16), (37, 16), (37, 8)))
    full_out, full_lse = _attend(q, keys, values)
    bounds = [0, 10, 11, 30, 37]  # uneven parts, one of a single key
    parts = [_attend(q, keys[a:b], values[a:b]) for a, b in itertools.pairwise(bounds)]
    out, lse = lse_combine(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    torch.testing.assert_close(out, full_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, full_lse, rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    keys=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_any_split_of_the_keys_merges_to_the_whole(keys, cuts, seed):
    # Empty parts (repeated cuts) are parts with LSE -inf and must not matter.
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, generator=gen) for s in ((3, 8), (keys, 8), (keys, 4)))
    bounds = [0, *sorted(min(c, keys) for c in cuts), keys]
    outs, lses = [], []
    for a, b in itertools.pairwise(bounds):
        if b > a:
            out, lse = _attend(q, k[a:b], v[a:b])
        else:
            out, lse = torch.zeros(3, 4), torch.full((3,), -INF)
        outs.append(out)
        lses.append(lse)
    out, lse = lse_combine(torch.stack(outs), torch.stack(lses))
    full_out, full_lse = _attend(q, k, v)
    torch.testing.assert_close(out, full_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, full_lse, rtol=1e-5, atol=1e-5)


def test_empty_parts_contribute_nothing_even_with_nan_outputs():
    gen = torch.Generator().manual_seed(1)
    outs = torch.randn(3, 4, 8, generator=gen)
    lses = torch.randn(3, 4, generator=gen)
    lses[1] = -INF
    outs[1] = float("nan")
    out, lse = lse_combine(outs, lses)
    ref_out, ref_lse = lse_combine(outs[[0, 2]], lses[[0, 2]])
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_all_parts_empty_gives_zero_and_minus_inf():
    outs = torch.full((2, 3, 4), float("nan"))
    lses = torch.full((2, 3), -INF)
    out, lse = lse_combine(outs, lses)
    assert torch.equal(out, torch.zeros(3, 4)) and bool((lse == -INF).all())


def test_single_part_is_returned_unchanged():
    outs = torch.randn(1, 5, 2, 16)
    lses = torch.randn(1, 5, 2)
    out, lse = lse_combine(outs, lses)
    assert torch.equal(out, outs[0]) and torch.equal(lse, lses[0])


def test_bf16_parts_combine_in_fp32_and_return_bf16():
    gen = torch.Generator().manual_seed(2)
    outs = torch.randn(4, 6, 32, generator=gen)
    lses = torch.randn(4, 6, generator=gen) * 3
    out, _ = lse_combine(outs.bfloat16(), lses)
    ref, _ = lse_combine(outs.bfloat16().float(), lses)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.bfloat16())


def test_fixed_order_is_bitwise_stable_and_rows_do_not_interact():
    gen = torch.Generator().manual_seed(3)
    outs = torch.randn(5, 64, 128, generator=gen)
    lses = torch.randn(5, 64, generator=gen) * 4
    out, lse = lse_combine(outs, lses)
    out2, lse2 = lse_combine(outs.clone(), lses.clone())
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    for row in (0, 17, 63):
        alone_out, alone_lse = lse_combine(outs[:, row : row + 1], lses[:, row : row + 1])
        assert torch.equal(alone_out[0], out[row]) and torch.equal(alone_lse[0], lse[row])


@pytest.mark.parametrize(
    ("outs", "lses", "message"),
    [
        (torch.zeros(2, 3, 4), torch.zeros(2, 4), "same leading dims"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.bfloat16), "lses must be float32"),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.zeros(2, 3), "outs must be float32"),
        (torch.zeros(2, 3, 4), torch.tensor([[0.0, INF, 0.0]] * 2), "\\+inf or NaN"),
        (torch.zeros(0, 3, 4), torch.zeros(0, 3), "at least one part"),
    ],
)
def test_bad_input_says_what_was_expected(outs, lses, message):
    with pytest.raises(ValueError, match=message):
        lse_combine(outs, lses)
