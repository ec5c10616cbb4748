"""kda.step and kda.chunk against fla's naive_recurrent_kda (the oracle) and each other."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.ops import kda

with warnings.catch_warnings():  # fla warns that Triton has no GPU here; the naive oracle is torch
    warnings.simplefilter("ignore")
    naive = pytest.importorskip("fla.ops.kda.naive")


def _inputs(batch=2, tokens=37, heads=2, value_heads=4, key_dim=32, value_dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, tokens, heads, key_dim, generator=gen)
    k = torch.nn.functional.normalize(
        torch.randn(batch, tokens, heads, key_dim, generator=gen), dim=-1
    )
    v = torch.randn(batch, tokens, value_heads, value_dim, generator=gen)
    g = -torch.rand(batch, tokens, value_heads, key_dim, generator=gen) * 0.3  # log decay <= 0
    beta = torch.rand(batch, tokens, value_heads, generator=gen)
    state = torch.randn(batch, value_heads, key_dim, value_dim, generator=gen)
    return q, k, v, g, beta, state


def _oracle(q, k, v, g, beta, state, scale=None):
    return naive.naive_recurrent_kda(
        q, k, v, g, beta, scale=scale, initial_state=state, output_final_state=True
    )


@pytest.mark.parametrize("scale", [None, 0.3])
def test_step_matches_fla_naive_recurrence(scale):
    q, k, v, g, beta, state = _inputs()
    ref_o, ref_s = _oracle(q, k, v, g, beta, state, scale)
    o, s = kda.step(q, k, v, g, beta, state, scale)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, ref_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [64, 16, 5, 1])
def test_chunk_matches_fla_naive_recurrence(chunk_size):
    # 37 tokens: never a multiple of the chunk size except 1, so the short tail chunk is covered.
    q, k, v, g, beta, state = _inputs()
    ref_o, ref_s = _oracle(q, k, v, g, beta, state)
    o, s = kda.chunk(q, k, v, g, beta, state, chunk_size=chunk_size)
    torch.testing.assert_close(o, ref_o, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, ref_s, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    tokens=st.integers(1, 20),
    heads=st.integers(1, 3),
    group=st.integers(1, 2),
    key_dim=st.sampled_from([4, 8, 12]),
    value_dim=st.sampled_from([3, 8]),
    chunk_size=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_step_and_chunk_match_fla_on_random_shapes(
    tokens, heads, group, key_dim, value_dim, chunk_size, seed
):
    args = _inputs(1, tokens, heads, heads * group, key_dim, value_dim, seed)
    ref_o, ref_s = _oracle(*args)
    for o, s in (kda.step(*args), kda.chunk(*args, chunk_size=chunk_size)):
        torch.testing.assert_close(o, ref_o, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s, ref_s, rtol=1e-4, atol=1e-4)


def test_bf16_inputs_and_a_zero_state():
    q, k, v, g, beta, _ = _inputs(batch=1, tokens=20, heads=3, value_heads=3)
    args = [x.bfloat16() for x in (q, k, v)] + [g, beta.bfloat16()]
    ref_o, ref_s = _oracle(*args, None)
    o, s = kda.chunk(*args, None, chunk_size=8)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(o.float(), ref_o.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(s, ref_s, rtol=1e-4, atol=1e-4)


def test_prefill_then_decode_continues_the_state():
    q, k, v, g, beta, state = _inputs(tokens=24)
    full_o, full_s = kda.step(q, k, v, g, beta, state)
    head = [x[:, :20] for x in (q, k, v, g, beta)]
    tail = [x[:, 20:] for x in (q, k, v, g, beta)]
    o1, s1 = kda.chunk(*head, state, chunk_size=8)
    o2, s2 = kda.step(*tail, s1)
    torch.testing.assert_close(torch.cat([o1, o2], dim=1), full_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s2, full_s, rtol=1e-5, atol=1e-5)


def test_the_input_state_is_not_modified():
    q, k, v, g, beta, state = _inputs(tokens=4)
    before = state.clone()
    kda.step(q, k, v, g, beta, state)
    kda.chunk(q, k, v, g, beta, state)
    assert torch.equal(state, before)


def test_bad_input_says_what_was_expected():
    q, k, v, g, beta, state = _inputs(tokens=3)
    with pytest.raises(ValueError, match="multiple of H=2"):
        kda.step(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3], None)
    with pytest.raises(ValueError, match="g must be \\[B, T, HV, K\\]"):
        kda.step(q, k, v, g[..., :8], beta, state)
    with pytest.raises(ValueError, match="beta must be \\[B, T, HV\\]"):
        kda.step(q, k, v, g, beta[:, :2], state)
    with pytest.raises(ValueError, match="state must be float32"):
        kda.step(q, k, v, g, beta, state.bfloat16())
    with pytest.raises(ValueError, match="q and k must both be"):
        kda.chunk(q, k[..., :8], v, g, beta, state)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        kda.chunk(q, k, v, g, beta, state, chunk_size=0)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        kda.step(q.to(torch.int32), k, v, g, beta, state)
