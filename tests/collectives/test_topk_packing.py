"""The 32-bit candidate packing and the merge order of dcp.topk_merge, on one process."""

import math

import pytest
import torch

from hwrun.collectives import dcp
from hwrun.collectives.communicator import CollectiveError, Communicator
from hwrun.collectives.topk_merge import merge_key, orderable_bf16


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


def every_bf16() -> torch.Tensor:
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    return bits.view(torch.bfloat16).float()


def test_orderable_bf16_preserves_the_order_of_every_bf16_value() -> None:
    values = every_bf16()
    keep = ~values.isnan() & ~values.isneginf()
    values = values[keep]
    keys = orderable_bf16(values)
    order = torch.argsort(values, stable=True)
    sorted_keys, sorted_values = keys[order], values[order]
    assert bool((sorted_keys[1:] >= sorted_keys[:-1]).all())
    # equal keys only for equal values (-0 and +0)
    same = sorted_keys[1:] == sorted_keys[:-1]
    assert bool((sorted_values[1:][same] == sorted_values[:-1][same]).all())
    assert int(same.sum()) == 1
    assert bool((keys > 0).all())


def test_no_candidate_values_and_rounding() -> None:
    x = torch.tensor([float("-inf"), float("nan"), -float("nan"), -3.4e38, 1.0, 1.0 + 2**-10])
    keys = orderable_bf16(x).tolist()
    assert keys[:4] == [0, 0, 0, 0]  # -inf, NaN of either sign, fp32 that rounds to -inf
    assert keys[4] == keys[5]  # equal after bf16 rounding
    assert orderable_bf16(torch.tensor([-0.0])).item() == orderable_bf16(torch.tensor([0.0])).item()


def test_merge_key_orders_by_score_then_rank_then_ordinal() -> None:
    s = torch.tensor([0x9000, 0x9000, 0x9000, 0x8FFF])
    keys = merge_key(s, torch.tensor([0, 0, 1, 0]), torch.tensor([0, 1, 0, 0]))
    assert keys[0] > keys[1] > keys[2] > keys[3]
    assert merge_key(torch.tensor([0]), 0, torch.tensor([0])).item() == 0


@pytest.mark.parametrize(
    "world, k, c", [(1, 2048, 2048), (2, 2048, 1536), (8, 2048, 384), (3, 7, 4)]
)
def test_candidates_per_rank(world: int, k: int, c: int) -> None:
    assert dcp.candidates_per_rank(k, world) == c == min(k, math.ceil(1.5 * k / world))


def test_single_rank_merge_is_the_local_top_k() -> None:
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 4, (5, 50), generator=g).float()
    scores[4, 10:] = float("-inf")
    result = dcp.topk_merge(SingleRank(), scores, 16)
    rounded = scores.to(torch.bfloat16).float()
    want = torch.sort(rounded, dim=1, descending=True, stable=True).indices[:, :16]
    want[4, 10:] = -1
    assert torch.equal(result.local_indices.long(), want)
    assert result.num_local.tolist() == [16, 16, 16, 16, 10]
    assert result.bytes_sent == 0 and not bool(result.resend.any())


def test_merge_refuses_bad_shapes_and_k() -> None:
    with pytest.raises(ValueError, match=r"\[R, L_local\]"):
        dcp.topk_merge(SingleRank(), torch.zeros(4), 2)
    with pytest.raises(ValueError, match="65536"):
        dcp.topk_merge(SingleRank(), torch.zeros(1, 4), 70000)


class Reversing(SingleRank):
    """A broken communicator: all_gather returns each row's candidates reversed."""

    def all_gather(self, x):
        return x.flip(-1).unsqueeze(0)


def test_a_communicator_that_reorders_candidates_is_caught() -> None:
    with pytest.raises(CollectiveError, match="out of order"):
        dcp.topk_merge(Reversing(), torch.randn(2, 40), 8)
