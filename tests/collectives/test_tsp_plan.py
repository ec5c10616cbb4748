"""The balanced causal split of token-sharded prefill, and DCP's token ownership arithmetic."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.collectives import dcp, tsp

lengths = st.lists(st.integers(0, 3000), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(lens=lengths, world=st.integers(1, 8))
def test_every_token_belongs_to_exactly_one_rank(lens: list[int], world: int) -> None:
    plan = tsp.balanced_plan(lens, world)
    owned = torch.cat(plan.token_indices)
    assert sorted(owned.tolist()) == list(range(sum(lens)))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5000), world=st.integers(2, 8))
def test_causal_work_per_rank_differs_by_at_most_one_query_row(n: int, world: int) -> None:
    # One query row attends at most n keys, and the last piece holds the row that attends n:
    # so "one row" is within "one piece's worth".
    work = tsp.causal_work(tsp.balanced_plan([n], world))
    assert max(work) - min(work) <= n
    assert sum(work) == n * (n + 1) // 2


def test_rank_takes_an_early_and_a_late_piece() -> None:
    plan = tsp.balanced_plan([16], 4)  # 8 pieces of 2 tokens
    assert plan.token_indices[0].tolist() == [0, 1, 14, 15]
    assert plan.token_indices[3].tolist() == [6, 7, 8, 9]
    assert tsp.causal_work(plan) == [34, 34, 34, 34]


def test_the_unbalanced_contiguous_split_would_fail_the_bound() -> None:
    # the property above is not vacuous: giving rank r the r-th contiguous quarter is far off
    n, world = 1000, 4
    quarters = [sum(t + 1 for t in range(r * n // world, (r + 1) * n // world)) for r in range(4)]
    assert max(quarters) - min(quarters) > n


@pytest.mark.parametrize("length, world", [(0, 3), (1, 4), (7, 8), (1000, 8), (10, 3)])
def test_dcp_shards_cover_the_context(length: int, world: int) -> None:
    tokens = torch.arange(length)
    shards = [dcp.shard_context(tokens, r, world) for r in range(world)]
    assert [s.numel() for s in shards] == [dcp.local_length(length, r, world) for r in range(world)]
    for r, shard in enumerate(shards):
        assert torch.equal(dcp.owner_rank(shard, world), torch.full_like(shard, r))
        local = torch.arange(shard.numel())
        assert torch.equal(dcp.local_to_global(local, r, world), shard)
    assert dcp.local_to_global(torch.tensor([-1, 2]), 1, world).tolist() == [-1, 2 * world + 1]
