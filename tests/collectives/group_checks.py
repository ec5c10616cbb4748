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
from hwrun.ops.topk import topk as reference_topk_op

NEG_INF = float("-inf")


def reference_topk(
    scores: torch.Tensor,  # [R, L] every token's score, in token order
    k: int,
    lengths: torch.Tensor | None = None,  # [R] row lengths; None: every column
) -> torch.Tensor:
    """The single-device ``indexer.topk`` on the fp32 scores: [R, k] token positions, -1 padded."""
    rows, length = scores.shape
    ends = torch.full((rows,), length) if lengths is None else lengths
    starts = torch.zeros(rows, dtype=torch.int32)
    return reference_topk_op(scores.float(), starts, ends.to(torch.int32), k)


def rank_share(best: torch.Tensor, rank: int, world: int) -> list[list[int]]:
    """Per row, the local indices of ``rank``'s tokens in ``best`` [R, k], in ``best``'s order:
    what that rank's merge must return."""
    return [[t // world for t in row.tolist() if t >= 0 and t % world == rank] for row in best]


def merged_lists(result: dcp.TopkMergeResult) -> list[list[int]]:
    """Per row, the local indices the merge selected on this rank, best first."""
    return [
        row[:n].tolist()
        for row, n in zip(result.local_indices.long(), result.num_local.tolist(), strict=True)
    ]


def shard_and_merge(
    comm: Communicator,
    scores: torch.Tensor,  # [R, L] the global scores; this rank takes its shard
    k: int,
    lengths: torch.Tensor | None = None,
    candidates: int | None = None,
    device: str = "cpu",
) -> dcp.TopkMergeResult:
    world, rank = comm.world_size, comm.rank
    shard = dcp.shard_context(scores.T, rank, world).T.contiguous().to(device)
    sent_lengths = None if lengths is None else lengths.to(device)
    return dcp.topk_merge(comm, shard, k, lengths=sent_lengths, candidates=candidates)


def mismatched_rows(
    merged: list[list[list[int]]],  # per rank, merged_lists of its result
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
) -> list[int]:
    """Rows where some rank's selection differs from its share of the reference top-k."""
    best = reference_topk(scores, k, lengths)
    world = len(merged)
    wants = [rank_share(best, rank, world) for rank in range(world)]
    return [
        i
        for i in range(scores.shape[0])
        if any(merged[rank][i] != wants[rank][i] for rank in range(world))
    ]


def compare_merge(
    comm: Communicator,
    scores: torch.Tensor,  # [R, L] the global scores; each rank takes its shard
    k: int,
    label: str,
    device: str,
    lengths: torch.Tensor | None = None,
    candidates: int | None = None,
) -> tuple[list[str], dcp.TopkMergeResult]:
    """Run the merge on this rank's shard of ``scores`` and compare its tokens, in order, with
    this rank's share of the single-device top-k; also check the ranks agree on the rounds."""
    world, rank = comm.world_size, comm.rank
    result = shard_and_merge(comm, scores, k, lengths, candidates, device)
    got = merged_lists(result)
    want = rank_share(reference_topk(scores, k, lengths), rank, world)
    where = f"{label} W={world} k={k} c={candidates} rank {rank}"
    problems = [
        f"{where} row {i}: merged {got[i][:8]}... vs reference {want[i][:8]}... "
        f"({len(got[i])} vs {len(want[i])} tokens)"
        for i in range(len(want))
        if got[i] != want[i]
    ]
    padding = result.local_indices.long().cpu() >= 0
    if not torch.equal(padding.sum(1), result.num_local.long().cpu()):
        problems.append(f"{where}: local_indices is not num_local ids then -1")
    shared = torch.cat(
        [
            result.resend.long().flatten().cpu(),
            result.tie_round.long().cpu(),
            torch.tensor([result.rounds]),
        ]
    )
    agreed = comm.all_gather(shared.to(device))
    if not bool((agreed == agreed[0]).all()):
        problems.append(f"{where}: ranks disagree on resend flags, tie rounds or rounds")
    return problems, result


def check_topk_random(comm: Communicator, device: str) -> list[str]:
    problems = []
    for seed, (rows, length, k) in enumerate([(6, 300, 32), (4, 1000, 96), (3, 97, 7)]):
        g = torch.Generator().manual_seed(seed)
        scores = torch.randn(rows, length, generator=g)
        problems += compare_merge(comm, scores, k, f"random seed {seed}", device)[0]
        relu_sum = torch.relu(torch.randn(rows, length, 4, generator=g)).sum(-1)  # indexer-like
        problems += compare_merge(comm, relu_sum, k, f"relu-sum seed {seed}", device)[0]
        lengths = torch.randint(0, length + 1, (rows,), generator=g)
        problems += compare_merge(comm, relu_sum, k, f"lengths seed {seed}", device, lengths)[0]
    return problems


def check_topk_adversarial(comm: Communicator, device: str) -> tuple[list[str], dict[str, int]]:
    """Adversarial rows; also returns how many rows took the resend and the tie rounds."""
    world = comm.world_size
    g = torch.Generator().manual_seed(100 + world)
    length, k = 24 * world + 29, 32  # rows longer than k + 3 at every W
    cols = torch.arange(length)
    problems, rounds = [], {"resent_rows": 0, "tie_rows": 0}

    def compare(scores, k, label, lengths=None, candidates=None):
        found, result = compare_merge(comm, scores, k, label, device, lengths, candidates)
        problems.extend(found)
        return result

    winners = torch.randn(4, length, generator=g)
    for row, owner in enumerate([0, world - 1, world // 2, 0]):
        winners[row, cols % world == owner] += 100.0  # every winner on one rank
    result = compare(winners, k, "winners-on-one-rank")
    rounds["resent_rows"] += int(result.resend.any(1).sum())
    if world > 1 and not bool(result.resend.any(1).all()):
        problems.append(f"winners-on-one-rank W={world}: the resend path did not run on every row")
    compare(winners, k, "winners-on-one-rank, c = k", candidates=k)

    # ReLU with one index head: about half the scores are exactly 0, and fewer than k are
    # positive, so the k-th score is 0 and its ties straddle the threshold on every rank
    zeros = torch.relu(torch.randn(4, length, generator=g))
    zeros[:, k // 3 :] = 0.0
    zeros[1] = 0.0  # every score 0: the top-k is tokens 0 .. k-1
    zeros[2, ::3] = -0.0  # -0 ties with +0
    result = compare(zeros, k, "relu zeros")
    rounds["tie_rows"] += int(result.tie_round.sum())
    if world > 1 and not bool(result.tie_round.all()):
        problems.append(f"relu zeros W={world}: the tie round did not run on every row")
    compare(zeros, k, "relu zeros, c = k", candidates=k)

    # ties crowded onto rank 0's early tokens (the others tie only late): rank 0 must give more
    # than its first share of tied ids, so the tie round sends the rest
    crowded = torch.full((2, length), -1.0)
    crowded[:, (cols % world == 0) | (cols > length // 2)] = 0.0
    crowded[1, world + 1 :: 7 * world] = 3.0
    result = compare(crowded, k, "crowded ties")
    if world > 1 and result.rounds != 3:
        problems.append(f"crowded ties W={world}: {result.rounds} rounds, expected 1 + 2 for ties")
    zero_lengths = torch.tensor([length, k + 3, length - 1, length - 7])
    compare(zeros, k, "relu zeros, lengths", zero_lengths)

    ties = torch.randint(0, 3, (5, length), generator=g).float()  # few distinct values
    ties[1] = 1.0 + torch.rand(length, generator=g) * 2**-10  # distinct in fp32, equal in bf16
    ties[2] = torch.where(cols % 5 == 0, float("nan"), ties[2])  # NaN is -inf
    ties[3] = torch.where(cols % 8 == 1, 0.0, float("-inf"))  # -inf tokens fill the top-k
    ties[3, 3] = 5.0
    ties[4] = float("-inf")  # every token -inf: still the k smallest positions
    compare(ties, k, "ties")

    short = torch.randn(5, length, generator=g)
    short_lengths = torch.tensor([0, 1, world - 1, k // 2, k + 1])  # rows shorter than k
    compare(short, k, "short rows", short_lengths)
    result = compare(short, k, "lengths <= k", torch.tensor([0, 1, k, k // 2, world]))
    if result.rounds != 0:
        problems.append(f"lengths <= k W={world}: {result.rounds} collectives, expected none")
    compare(short[:, : k // 2], k, "every row shorter than k")  # all selected, as -1 padding

    big_k = 3 * length // 4  # k larger than any rank's share, rows longer than k
    compare(torch.randn(3, length, generator=g), big_k, "k > share")
    compare(torch.randn(3, length, generator=g), length + 9, "k > L")
    compare(torch.randn(3, length, generator=g), 1, "k = 1")
    compare(torch.randn(2, world - 1, generator=g), 4, "L < W: the last rank holds nothing")
    compare(torch.zeros(2, 0), 4, "L = 0: every shard empty")
    return problems, rounds


def check_lse_combine(comm: Communicator, device: str) -> list[str]:
    """DCP attention (merge, local sparse attention, LSE combine) = single-device attention."""
    world, rank = comm.world_size, comm.rank
    g = torch.Generator().manual_seed(7)
    rows, heads, length, k = 3, 24, 16 * world + 3, 12  # 24 heads split over W = 2, 3, 4, 8
    q = torch.randn(rows, heads, sparse_mla.QK_DIM, generator=g)
    kv = torch.randn(length, sparse_mla.QK_DIM, generator=g)
    scores = torch.randn(rows, length, generator=g)
    scores[1, torch.arange(length) % world == 0] += 50.0  # ranks > 0 hold nothing: lse -inf
    lengths = torch.tensor([length, length, 0])  # row 2 is empty: out 0, lse -inf
    scale = sparse_mla.QK_DIM**-0.5

    want_idx = reference_topk(scores, k, lengths)
    want_out, want_lse = sparse_mla.prefill(q, kv, want_idx, scale)

    merged = shard_and_merge(comm, scores, k, lengths, device=device)
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
    # several requests in one all-gather (the engine's prefill under DCP): each in token order
    lengths = [3, 0, world + 1, 1, 2 * world]
    requests = [
        torch.arange(n * 4, dtype=torch.int32).view(n, 4) + 1000 * i for i, n in enumerate(lengths)
    ]
    local = torch.cat([dcp.shard_context(rows, rank, world) for rows in requests]).to(device)
    if not torch.equal(dcp.gather_contexts(comm, local, lengths).cpu(), torch.cat(requests)):
        problems.append(f"gather_contexts W={world} lengths={lengths}: rows differ")
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
    adversarial, rounds = check_topk_adversarial(comm, device)
    return {
        "communicator": check_communicator(comm, device),
        "topk_random": check_topk_random(comm, device),
        "topk_adversarial": adversarial,
        **rounds,  # resent_rows, tie_rows
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
    """``dying_rank`` exits without a word; the others' merge must fail, saying how fast.

    It dies only once every rank has joined the group (the barrier) and left the barrier (the
    pause): exiting at once, it could close its sockets while a slower rank was still
    connecting, whose init_process_group then failed before any collective (seen in CI on two
    cores, 2026-12-04)."""
    comm.barrier()
    if comm.rank == dying_rank:
        time.sleep(0.5)
        os._exit(3)
    start = time.monotonic()
    try:
        dcp.topk_merge(comm, torch.randn(2, 64), 8)
    except CollectiveError as exc:
        raise CollectiveError(f"failed after {time.monotonic() - start:.2f} s: {exc}") from exc
