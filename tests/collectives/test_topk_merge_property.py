"""dcp.topk_merge is exact on generated inputs: ties, -inf, NaN, skew, short rows, any k, W.

The ranks run as threads (thread_group.py) so hypothesis can try many inputs; the gloo groups
of test_group.py check the same merge across real processes.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.collectives import dcp

from .group_checks import reference_topk_sets
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
    if draw(st.booleans()):  # few distinct values: ties everywhere
        picks = torch.randint(0, len(VALUES), (rows, length), generator=g)
        scores = torch.tensor(VALUES)[picks]
    else:
        scores = torch.randn(rows, length, generator=g)
    favoured = draw(st.integers(-1, world - 1))  # skew: one rank's tokens win
    if favoured >= 0:
        scores[:, torch.arange(length) % world == favoured] += 100.0
    return world, scores, k


def _merge(comm, scores, k):
    result = dcp.topk_merge(comm, scores[:, comm.rank :: comm.world_size], k)
    glob = dcp.local_to_global(result.local_indices.long(), comm.rank, comm.world_size)
    return [set(row[row >= 0].tolist()) for row in glob], result.resend


@settings(max_examples=250, deadline=None)
@given(merge_inputs())
def test_merge_equals_the_single_device_top_k(case) -> None:
    world, scores, k = case
    per_rank = run_threads(_merge, world, scores, k)
    merged = [set().union(*(sets[i] for sets, _ in per_rank)) for i in range(scores.shape[0])]
    assert merged == reference_topk_sets(scores, k, world)
    flags = [resend for _, resend in per_rank]
    assert all(torch.equal(f, flags[0]) for f in flags)
