"""dcp.topk_merge selects exactly the single-device ``indexer.topk`` on generated inputs: ties
(ReLU zeros, -0, scores equal in bf16 but not in fp32), -inf, NaN, skew, row lengths, empty
shards, any k, W and round-1 candidate count.

The ranks run as threads (thread_group.py) so hypothesis can try many inputs; the gloo groups
of test_group.py check the same merge across real processes.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from .group_checks import merged_lists, mismatched_rows, shard_and_merge
from .thread_group import run_threads

VALUES = [0.0, -0.0, 1.0, 1.0 + 2**-12, 2.0, -1.0, float("-inf"), float("nan"), 7.5]


@st.composite
def merge_inputs(draw):
    world = draw(st.integers(1, 8))
    rows = draw(st.integers(1, 4))
    length = draw(st.integers(0, 120))
    k = draw(st.integers(1, 130))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["ties", "relu", "crowded", "normal"]))
    positions = torch.arange(length)
    if kind == "ties":  # few distinct values: ties everywhere
        picks = torch.randint(0, len(VALUES), (rows, length), generator=g)
        scores = torch.tensor(VALUES)[picks]
    elif kind == "relu":  # one index head: about half the scores exactly 0
        scores = torch.relu(torch.randn(rows, length, generator=g))
    elif kind == "crowded":  # zeros on one rank's tokens, on the others' only from a position on
        late = draw(st.integers(0, length))
        scores = torch.where(torch.rand(rows, length, generator=g) < 0.1, 2.0, -1.0)
        crowd = (positions % world == draw(st.integers(0, world - 1))) | (positions >= late)
        scores[:, crowd & (scores[0] < 0)] = 0.0
    else:
        scores = torch.randn(rows, length, generator=g)
    favoured = draw(st.integers(-1, world - 1))  # skew: one rank's tokens win
    if favoured >= 0:
        scores[:, positions % world == favoured] += 100.0
    lengths = None
    if draw(st.booleans()):
        lengths = torch.randint(0, length + 1, (rows,), generator=g)
    candidates = draw(st.one_of(st.none(), st.integers(1, k)))
    return world, scores, k, lengths, candidates


@settings(max_examples=250, deadline=None)
@given(merge_inputs())
def test_merge_equals_the_single_device_top_k(case) -> None:
    world, scores, k, lengths, candidates = case
    results = run_threads(shard_and_merge, world, scores, k, lengths, candidates)
    assert mismatched_rows([merged_lists(r) for r in results], scores, k, lengths) == []
    for r in results[1:]:  # every rank ran the same rounds
        assert torch.equal(r.resend, results[0].resend)
        assert torch.equal(r.tie_round, results[0].tie_round)
        assert r.rounds == results[0].rounds
