"""dcp.topk_merge in one process: its W = 1 result, its rounds and bytes, its refusals, and the
negative controls (a merge on bf16-rounded scores, a wrong tie rule) that the comparison with
the single-device ``indexer.topk`` must catch. Ranks of W > 1 run as threads (thread_group.py);
test_group.py runs the same merge across gloo processes."""

import math

import pytest
import torch

from hwrun.collectives import dcp, topk_merge
from hwrun.collectives.communicator import CollectiveError, Communicator

from .group_checks import merged_lists, mismatched_rows, reference_topk, shard_and_merge
from .thread_group import run_threads


class SingleRank(Communicator):
    """W = 1: every collective returns this rank's own data."""

    rank = 0
    world_size = 1

    def all_gather(self, x):
        return x.unsqueeze(0).clone()

    def all_to_all(self, inputs, output_shapes):
        return [inputs[0].reshape(tuple(output_shapes[0])).clone()]

    def all_reduce(self, x, op="sum"):
        return x.clone()

    def barrier(self):
        pass


class NoCollectives(SingleRank):
    """Rank 0 of 2 whose peer is absent: any collective fails the test."""

    world_size = 2

    def all_gather(self, x):
        raise AssertionError("the merge ran a collective")

    all_to_all = all_reduce = all_gather


class Reversing(SingleRank):
    """A broken communicator: all_gather returns each row's candidates reversed."""

    def all_gather(self, x):
        return x.flip(-1).unsqueeze(0)


def merge_in_threads(scores, k, world, lengths=None, candidates=None):
    """Every rank's TopkMergeResult for the global scores [R, L], ranks as threads."""
    return run_threads(shard_and_merge, world, scores, k, lengths, candidates)


def mismatches(results, scores, k, lengths=None) -> list[int]:
    return mismatched_rows([merged_lists(r) for r in results], scores, k, lengths)


def test_single_rank_merge_is_indexer_topk() -> None:
    g = torch.Generator().manual_seed(3)
    values = torch.tensor([0.0, -0.0, 1.0, float("-inf"), float("nan"), 2.0])
    scores = values[torch.randint(0, len(values), (5, 50), generator=g)]
    lengths = torch.tensor([50, 40, 20, 3, 0])
    result = dcp.topk_merge(SingleRank(), scores, 16, lengths=lengths)
    assert torch.equal(result.local_indices, reference_topk(scores, 16, lengths))
    assert result.num_local.tolist() == [16, 16, 16, 3, 0]
    assert result.bytes_sent == 0 and not bool(result.resend.any())


def test_rows_no_longer_than_k_need_no_collective() -> None:
    scores = torch.randn(3, 10)  # rank 0's share of rows of up to 2 * 10 tokens
    lengths = torch.tensor([20, 7, 0])
    result = dcp.topk_merge(NoCollectives(), scores, 20, lengths=lengths)
    assert result.rounds == 0 and result.bytes_sent == 0
    assert result.num_local.tolist() == [10, 4, 0]
    want = reference_topk(scores, 20, torch.tensor([10, 4, 0]))  # all of rank 0's tokens
    assert torch.equal(result.local_indices, want)


@pytest.mark.parametrize(
    "world, k, c", [(1, 2048, 2048), (2, 2048, 1536), (8, 2048, 384), (3, 7, 4)]
)
def test_candidates_per_rank(world: int, k: int, c: int) -> None:
    assert dcp.candidates_per_rank(k, world) == c == min(k, math.ceil(1.5 * k / world))


def test_rounds_and_bytes_per_query() -> None:
    world, k, rows, length = 4, 64, 3, 1000
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(rows, length, generator=g)
    c = dcp.candidates_per_rank(k, world)  # 24
    one = merge_in_threads(scores, k, world)
    assert all(r.rounds == 1 and r.bytes_sent == (world - 1) * rows * c * 4 for r in one)
    every = merge_in_threads(scores, k, world, candidates=k)  # the seed's AMD variant
    assert all(r.rounds == 1 and r.bytes_sent == (world - 1) * rows * k * 4 for r in every)
    assert mismatches(one, scores, k) == mismatches(every, scores, k) == []

    # every score 0: every rank's worst sent score is the threshold, so nothing is resent, but
    # the ties straddle it on every rank (tie round): each sends the local ids of its first
    # ceil(1.5 k / W) tied tokens, and the k smallest positions are among them
    zeros = torch.zeros(1, length)
    share = math.ceil(1.5 * k / world)
    for candidates, sent in ((None, c), (k, k)):
        tied = merge_in_threads(zeros, k, world, candidates=candidates)
        assert [r.rounds for r in tied] == [2] * world
        assert all(r.bytes_sent == (world - 1) * (sent + share) * 4 for r in tied)
        assert [r.num_local.item() for r in tied] == [k // world] * world  # tokens 0 .. k-1
        assert mismatches(tied, zeros, k) == []

    # the k-th score is above every rank's c-th: a rank holding more winners resends
    skewed = scores.clone()
    skewed[:, ::world] += 100.0  # rank 0 holds every winner
    resent = merge_in_threads(skewed, k, world)
    assert [r.rounds for r in resent] == [2] * world
    assert resent[0].bytes_sent == (world - 1) * rows * k * 4  # c, then the other k - c
    assert resent[1].bytes_sent == (world - 1) * rows * c * 4
    assert mismatches(resent, skewed, k) == []


def test_merge_refuses_bad_inputs() -> None:
    comm = SingleRank()
    with pytest.raises(ValueError, match=r"\[R, L_local\]"):
        dcp.topk_merge(comm, torch.zeros(4), 2)
    with pytest.raises(ValueError, match=r"\[R, L_local\]"):
        dcp.topk_merge(comm, torch.zeros(1, 4, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="positive int"):
        dcp.topk_merge(comm, torch.zeros(1, 4), 0)
    with pytest.raises(ValueError, match="candidates"):
        dcp.topk_merge(comm, torch.zeros(1, 4), 2, candidates=3)
    with pytest.raises(ValueError, match="int tensor"):
        dcp.topk_merge(comm, torch.zeros(2, 4), 2, lengths=torch.tensor([4.0, 4.0]))
    with pytest.raises(ValueError, match="only 4 columns"):
        dcp.topk_merge(comm, torch.zeros(2, 4), 2, lengths=torch.tensor([4, 5]))


def test_a_communicator_that_reorders_candidates_is_caught() -> None:
    with pytest.raises(CollectiveError, match="out of order"):
        dcp.topk_merge(Reversing(), torch.randn(2, 40), 8)


@pytest.mark.parametrize("world", [2, 4])
def test_negative_control_the_old_bf16_merge_is_caught(world: int) -> None:
    # the merge before issue 22 rounded scores to bf16: on random rows its set differs from
    # the fp32 top-k (the issue counted 46 of 96 rows); the same comparison must see it
    g = torch.Generator().manual_seed(world)
    scores, k = torch.randn(48, 512, generator=g), 64
    rounded = scores.to(torch.bfloat16).float()
    assert mismatches(merge_in_threads(scores, k, world), scores, k) == []
    assert len(mismatches(merge_in_threads(rounded, k, world), scores, k)) >= 24  # 46 seen


def test_negative_control_a_wrong_tie_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # ties broken by (rank, local index), the rule of the bf16 merge, instead of token position
    g = torch.Generator().manual_seed(1)
    zeros = torch.relu(torch.randn(8, 300, generator=g))
    zeros[:, 20:] = 0.0  # fewer than k positive: the 64th score is 0, tied on every rank
    assert mismatches(merge_in_threads(zeros, 64, 3), zeros, 64) == []
    monkeypatch.setattr(
        topk_merge, "_token_position", lambda local, rank, world: (rank << 40) + local
    )
    assert len(mismatches(merge_in_threads(zeros, 64, 3), zeros, 64)) == 8
