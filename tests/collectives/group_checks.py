"""Checks that run inside a W-rank group (one group per W, started by spawn_group).

Every rank builds the same global inputs from a seed, keeps its own shard, runs the distributed
op and compares with the single-device reference ops computed on the global inputs. A check
returns a list of mismatch descriptions (empty: passed); run_all returns them by check name.
"""

from __future__ import annotations

import os
import time

import torch

from hwrun.collectives import dcp, tsp
from hwrun.collectives.communicator import CollectiveError, Communicator
from hwrun.ops import sparse_mla
from hwrun.ops.topk import topk as reference_topk

NEG_INF = float("-inf")


def reference_topk_sets(scores: torch.Tensor, k: int, world: int) -> list[set[int]]:
    """The single-device top-k of global scores [R, L] as global token sets, under the merge's
    order: bf16-rounded score, then rank, then local index. That order is the reference's
    smallest-index rule over the tokens laid out rank-major (rank 0's tokens, then rank 1's...);
    tokens whose bf16 score is -inf (or NaN) are never selected."""
    rows, length = scores.shape
    rank_major = torch.cat([torch.arange(length)[r::world] for r in range(world)])
    rounded = scores.float().to(torch.bfloat16).float()[:, rank_major]
    ends = torch.full((rows,), length, dtype=torch.int32)
    best = reference_topk(rounded, torch.zeros_like(ends), ends, k).long()
    sets = []
    for i in range(rows):
        picked = best[i][best[i] >= 0]
        picked = picked[~torch.isneginf(rounded[i, picked]) & ~torch.isnan(rounded[i, picked])]
        sets.append(set(rank_major[picked].tolist()))
    return sets


def merged_sets(comm: Communicator, result: dcp.TopkMergeResult) -> list[set[int]]:
    glob = dcp.local_to_global(result.local_indices.long(), comm.rank, comm.world_size)
    everyone = comm.all_gather(glob)  # [W, R, k]
    return [
        set(row[row >= 0].tolist()) for row in everyone.transpose(0, 1).reshape(glob.shape[0], -1)
    ]


def compare_merge(
    comm: Communicator, scores: torch.Tensor, k: int, label: str, device: str
) -> list[str]:
    """Run the merge on this rank's shard of ``scores`` [R, L] and compare with the reference."""
    world, rank = comm.world_size, comm.rank
    result = dcp.topk_merge(comm, scores[:, rank::world].to(device), k)
    got = merged_sets(comm, result)
    want = reference_topk_sets(scores, k, world)
    problems = [
        f"{label} W={world} k={k} row {i}: {len(got[i])} merged vs {len(want[i])} reference, "
        f"{len(got[i] ^ want[i])} differ"
        for i in range(len(want))
        if got[i] != want[i]
    ]
    # every rank must agree on the threshold and on who resent
    agreed = comm.all_gather(torch.cat([result.threshold, result.resend.long().flatten()]))
    if not bool((agreed == agreed[0]).all()):
        problems.append(f"{label} W={world} k={k}: ranks disagree on threshold or resend flags")
    return problems


def check_topk_random(comm: Communicator, device: str) -> list[str]:
    problems = []
    for seed, (rows, length, k) in enumerate([(6, 300, 32), (4, 1000, 96), (3, 97, 7)]):
        g = torch.Generator().manual_seed(seed)
        scores = torch.randn(rows, length, generator=g)
        problems += compare_merge(comm, scores, k, f"random seed {seed}", device)
        relu_sum = torch.relu(torch.randn(rows, length, 4, generator=g)).sum(-1)  # indexer-like
        problems += compare_merge(comm, relu_sum, k, f"relu-sum seed {seed}", device)
    return problems


def check_topk_adversarial(comm: Communicator, device: str) -> tuple[list[str], int]:
    """Adversarial rows; also returns how many rows took the resend path on this rank."""
    world = comm.world_size
    g = torch.Generator().manual_seed(100 + world)
    length, k = 24 * world + 5, 32
    cols = torch.arange(length)
    problems, resent = [], 0
    winners = torch.randn(4, length, generator=g)
    for row, owner in enumerate([0, world - 1, world // 2, 0]):
        winners[row, cols % world == owner] += 100.0  # every winner on one rank
    result = dcp.topk_merge(comm, winners[:, comm.rank :: world].to(device), k)
    resent += int(result.resend.any(1).sum())
    if world > 1 and not bool(result.resend.any(1).all()):
        problems.append(f"winners-on-one-rank W={world}: the resend path did not run on every row")
    problems += compare_merge(comm, winners, k, "winners-on-one-rank", device)

    ties = torch.randint(0, 3, (5, length), generator=g).float()  # few distinct values
    ties[1] = 0.0  # one all-equal row (ReLU zeros)
    ties[2] = 1.0 + torch.rand(length, generator=g) * 2**-10  # distinct in fp32, equal in bf16
    ties[3, ::2] = -0.0  # -0 and +0 tie
    ties[3, 1::2] = 0.0
    ties[4] = torch.where(cols % 5 == 0, float("nan"), ties[4])  # NaN never selected
    problems += compare_merge(comm, ties, k, "ties", device)

    short = torch.randn(5, length, generator=g)
    for row, valid in enumerate([0, 1, world - 1, k // 2, k + 1]):  # rows shorter than k
        short[row, valid:] = NEG_INF
    problems += compare_merge(comm, short, k, "short rows", device)

    big_k = 3 * length // 4  # k larger than any rank's share, rows longer than k
    problems += compare_merge(comm, torch.randn(3, length, generator=g), big_k, "k > share", device)
    problems += compare_merge(
        comm, torch.randn(3, length, generator=g), length + 9, "k > L", device
    )
    problems += compare_merge(comm, torch.randn(3, length, generator=g), 1, "k = 1", device)
    tiny = torch.randn(2, world - 1, generator=g)  # the last rank holds no token at all
    problems += compare_merge(comm, tiny, 4, "L < W", device)
    return problems, resent


def check_lse_combine(comm: Communicator, device: str) -> list[str]:
    """DCP attention (merge, local sparse attention, LSE combine) = single-device attention."""
    world, rank = comm.world_size, comm.rank
    g = torch.Generator().manual_seed(7)
    rows, heads, length, k = 3, 24, 16 * world + 3, 12  # 24 heads split over W = 2, 3, 4, 8
    q = torch.randn(rows, heads, sparse_mla.QK_DIM, generator=g)
    kv = torch.randn(length, sparse_mla.QK_DIM, generator=g)
    scores = torch.randn(rows, length, generator=g)
    scores[1, torch.arange(length) % world == 0] += 50.0  # ranks > 0 hold nothing: lse -inf
    scores[2] = NEG_INF  # an empty row: out 0, lse -inf
    scale = sparse_mla.QK_DIM**-0.5

    want_sets = reference_topk_sets(scores, k, world)
    want_idx = torch.full((rows, k), -1, dtype=torch.int32)
    for i, chosen in enumerate(want_sets):
        want_idx[i, : len(chosen)] = torch.tensor(sorted(chosen), dtype=torch.int32)
    want_out, want_lse = sparse_mla.prefill(q, kv, want_idx, scale)

    merged = dcp.topk_merge(comm, scores[:, rank::world].to(device), k)
    part_out, part_lse = sparse_mla.prefill(
        q, dcp.shard_context(kv, rank, world), merged.local_indices.cpu(), scale
    )
    problems = []
    for heads_sharded in (False, True):
        out, lse = dcp.lse_combine(
            comm, part_out.to(device), part_lse.to(device), heads_sharded=heads_sharded
        )
        out, lse = out.cpu(), lse.cpu()
        share = heads // world if heads_sharded else heads
        first = rank * share if heads_sharded else 0
        exp_out, exp_lse = want_out[:, first : first + share], want_lse[:, first : first + share]
        if not torch.allclose(out, exp_out, atol=1e-5, rtol=1e-5):
            err = (out - exp_out).abs().max().item()
            problems.append(
                f"lse_combine W={world} heads_sharded={heads_sharded}: out off by {err}"
            )
        if not torch.equal(torch.isneginf(lse), torch.isneginf(exp_lse)) or not torch.allclose(
            lse.nan_to_num(neginf=0.0), exp_lse.nan_to_num(neginf=0.0), atol=1e-5
        ):
            problems.append(f"lse_combine W={world} heads_sharded={heads_sharded}: lse differs")
    return problems


def check_tsp(comm: Communicator, device: str) -> list[str]:
    world, rank = comm.world_size, comm.rank
    problems = []
    for lens in ([37], [5, 0, 2 * world * 3 + 1, 1], [4 * world]):
        plan = tsp.balanced_plan(lens, world)
        g = torch.Generator().manual_seed(sum(lens))
        full = torch.randn(plan.num_tokens, 2 * world, 3, generator=g)  # [T, H, D]
        mine = full[:, 2 * rank : 2 * rank + 2]  # this rank's H/W heads
        mine = mine.to(device)
        tokens = tsp.heads_to_tokens(comm, mine, plan)
        if not torch.equal(tokens.cpu(), full[plan.token_indices[rank]]):
            problems.append(f"heads_to_tokens W={world} lens={lens}: wrong rows")
        if not torch.equal(tsp.tokens_to_heads(comm, tokens, plan), mine):
            problems.append(f"tokens_to_heads(heads_to_tokens(x)) != x, W={world} lens={lens}")
        back = tsp.heads_to_tokens(comm, tsp.tokens_to_heads(comm, tokens, plan), plan)
        if not torch.equal(back, tokens):
            problems.append(f"heads_to_tokens(tokens_to_heads(y)) != y, W={world} lens={lens}")
    return problems


def check_gather_context(comm: Communicator, device: str) -> list[str]:
    world, rank = comm.world_size, comm.rank
    problems = []
    for length in (0, 1, world - 1, 5 * world + 2):
        g = torch.Generator().manual_seed(length)
        rows = torch.randint(0, 256, (length, 656), generator=g, dtype=torch.uint8)  # cache rows
        got = dcp.gather_context(comm, dcp.shard_context(rows, rank, world).to(device), length)
        if not torch.equal(got.cpu(), rows):
            problems.append(f"gather_context W={world} L={length}: rows differ")
    return problems


def check_communicator(comm: Communicator, device: str) -> list[str]:
    world, rank = comm.world_size, comm.rank
    problems = []
    x = torch.tensor([rank, -rank], dtype=torch.float32, device=device)
    if comm.all_reduce(x).tolist() != [sum(range(world)), -sum(range(world))]:
        problems.append("all_reduce sum")
    if comm.all_reduce(x, "max").tolist() != [world - 1, 0]:
        problems.append("all_reduce max")
    if x.tolist() != [rank, -rank]:
        problems.append("all_reduce modified its input")
    comm.barrier()
    return problems


def run_all(comm: Communicator, device: str = "cpu") -> dict[str, object]:
    """Every check; ``device`` holds the tensors the collectives see ("cuda" under NCCL, with
    spawn_group(..., backend="nccl")); references run on the CPU."""
    adversarial, resent_rows = check_topk_adversarial(comm, device)
    return {
        "communicator": check_communicator(comm, device),
        "topk_random": check_topk_random(comm, device),
        "topk_adversarial": adversarial,
        "resent_rows": resent_rows,
        "lse_combine": check_lse_combine(comm, device),
        "tsp": check_tsp(comm, device),
        "gather_context": check_gather_context(comm, device),
    }


def stall_then_merge(comm: Communicator, stalled_rank: int, stall_s: float) -> dict[str, object]:
    """``stalled_rank`` enters the merge ``stall_s`` late; each rank says how its merge ended."""
    scores = torch.randn(2, 64, generator=torch.Generator().manual_seed(comm.rank))
    if comm.rank == stalled_rank:
        time.sleep(stall_s)
    start = time.monotonic()
    try:
        dcp.topk_merge(comm, scores, 8)
    except CollectiveError as exc:
        return {"error": str(exc), "elapsed_s": time.monotonic() - start}
    return {"error": None, "elapsed_s": time.monotonic() - start}


def die_before_merge(comm: Communicator, dying_rank: int) -> None:
    """``dying_rank`` exits without a word; the others' merge must fail, saying how fast."""
    if comm.rank == dying_rank:
        os._exit(3)
    start = time.monotonic()
    try:
        dcp.topk_merge(comm, torch.randn(2, 64), 8)
    except CollectiveError as exc:
        raise CollectiveError(f"failed after {time.monotonic() - start:.2f} s: {exc}") from exc
