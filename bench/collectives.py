"""Benchmark of the DCP top-k merge: bytes per rank and resend rate, one-round vs generic.

Runs W local gloo processes (default W = 8, k = 2048, 320 query rows = 64 requests x 5 query
tokens, 32K-token contexts sharded round-robin). For each score distribution it runs
``dcp.topk_merge`` and the generic merge (every rank's full local top-k as fp32 score + int32
token id, all-gathered), checks both select the same tokens, and prints bytes each rank sends,
how often the second round fires, and the CPU time of both (gloo on CPU: a correctness-scale
timing, not a GPU figure).

    .venv/bin/python bench/collectives.py [--world 8] [--k 2048] [--rows 320] [--context 32768]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from hwrun.collectives import dcp
from hwrun.collectives.communicator import Communicator
from hwrun.collectives.launch import spawn_group

INDEX_HEADS, INDEX_DIM = 8, 32


@dataclass(frozen=True)
class Distribution:
    """Indexer-like scores ``sum_h w_h relu(q_h . k_t)`` over Gaussian keys, optionally with the
    keys of every ``stride``-th token scaled by ``gain`` (a skew that round-robin sharding puts
    on the ranks ``0, stride, 2 stride, ...`` mod W) and a recency and attention-sink bonus."""

    description: str
    stride: int = 0
    gain: float = 1.0
    recency: bool = False


DISTRIBUTIONS = {
    "relu-sum, iid keys": Distribution("Gaussian keys, 8 index heads of dim 32"),
    "relu-sum + recency + sinks": Distribution(
        "+2 on the last 4K tokens' scores, +10 on the first 4", recency=True
    ),
    "skewed: every 4th key x1.1": Distribution("at W = 8: ranks 0 and 4 favoured", 4, 1.1),
    "skewed: every 4th key x1.3": Distribution("at W = 8: ranks 0 and 4 favoured", 4, 1.3),
    "skewed: every 8th key x3": Distribution("at W = 8: every winner on rank 0", 8, 3.0),
}


def local_scores(dist: Distribution, rows: int, context: int, comm: Communicator) -> torch.Tensor:
    """This rank's [rows, context / W] scores (the same global data on every rank: keys are
    drawn for all tokens, then sharded)."""
    g = torch.Generator().manual_seed(2048)
    q = torch.randn(rows, INDEX_HEADS, INDEX_DIM, generator=g)
    w = torch.rand(rows, INDEX_HEADS, generator=g)
    keys = torch.randn(context, INDEX_DIM, generator=g)
    positions = torch.arange(context)
    if dist.stride:
        keys[positions % dist.stride == 0] *= dist.gain
    mine = slice(comm.rank, None, comm.world_size)
    logits = torch.einsum("rhd,ld->rhl", q, keys[mine]).relu()
    scores = torch.einsum("rh,rhl->rl", w, logits)
    if dist.recency:
        pos = positions[mine]
        scores = scores + 2.0 * (pos >= context - 4096) + 10.0 * (pos < 4)
    return scores


def generic_merge(comm: Communicator, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """The baseline: all-gather every rank's local top-k (fp32 score, int32 global id); every
    rank takes the best k under the same order as dcp.topk_merge (bf16 score, rank, local
    index), so both select the same set. Returns this rank's selected local indices [R, k]
    (-1 padded) and the bytes it sent."""
    world, rank = comm.world_size, comm.rank
    rounded = scores.to(torch.bfloat16).float()
    m = min(k, scores.shape[1])
    # stable sorts: among equal scores the lower local index, then (rank-major concatenation)
    # the lower rank comes first
    top = torch.sort(rounded, dim=1, descending=True, stable=True)
    ids = dcp.local_to_global(top.indices[:, :m], rank, world).to(torch.int32)
    pair = torch.stack([top.values[:, :m], ids.view(torch.float32)], dim=-1)  # 8 bytes each
    gathered = comm.all_gather(pair)  # [W, R, m, 2]
    values = gathered[..., 0].permute(1, 0, 2).reshape(scores.shape[0], -1)
    owners = gathered[..., 1].contiguous().view(torch.int32).permute(1, 0, 2)
    owners = owners.reshape(scores.shape[0], -1).long()
    best = torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
    chosen = torch.gather(owners, 1, best)
    chosen = torch.where(torch.gather(values, 1, best).isneginf(), -1, chosen)
    local = torch.where((chosen >= 0) & (chosen % world == rank), chosen // world, -1)
    return local, (world - 1) * pair.numel() * 4


def _bench_rank(comm: Communicator, k: int, rows: int, context: int, iters: int) -> list[dict]:
    report = []
    for name, dist in DISTRIBUTIONS.items():
        scores = local_scores(dist, rows, context, comm)
        times_one, times_generic = [], []
        for _ in range(iters):
            comm.barrier()
            start = time.perf_counter()
            merged = dcp.topk_merge(comm, scores, k)
            times_one.append(time.perf_counter() - start)
            comm.barrier()
            start = time.perf_counter()
            generic, generic_bytes = generic_merge(comm, scores, k)
            times_generic.append(time.perf_counter() - start)
        ours = set(merged.local_indices[merged.local_indices >= 0].tolist())
        theirs = set(generic[generic >= 0].tolist())
        same = comm.all_reduce(torch.tensor([int(ours == theirs)]), "min").item()
        report.append(
            {
                "name": name,
                "bytes_one_round": merged.bytes_sent,
                "bytes_generic": generic_bytes,
                "rows_resent": int(merged.resend.any(1).sum()),
                "pairs_resent": int(merged.resend.sum()),
                "max_held": int(comm.all_reduce(merged.num_local.max(), "max")),
                "ms_one_round": 1e3 * statistics.median(times_one),
                "ms_generic": 1e3 * statistics.median(times_generic),
                "same_sets": bool(same),
            }
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    world, k, rows = args.world, args.k, args.rows
    ranks = spawn_group(
        _bench_rank, world, (k, rows, args.context, args.iters), timeout_s=300, deadline_s=1800
    )
    c = dcp.candidates_per_rank(k, world)
    print(
        f"W={world} k={k} rows={rows} context={args.context} (local {args.context // world}); "
        f"round 1 sends c={c} 32-bit words per row per peer vs {k} x 8 bytes generic"
    )
    print(
        "| distribution | bytes/rank one-round | bytes/rank generic | ratio (worst rank) "
        "| rows resent | (row, rank) resends | most top-k on one rank | ms one-round | ms generic "
        "| same sets |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, name in enumerate(DISTRIBUTIONS):
        per_rank = [r[i] for r in ranks]
        sent = max(r["bytes_one_round"] for r in per_rank)
        least = min(r["bytes_one_round"] for r in per_rank)
        span = f"{sent:,}" if least == sent else f"{least:,} to {sent:,}"
        generic = per_rank[0]["bytes_generic"]
        first = per_rank[0]
        print(
            f"| {name} | {span} | {generic:,} | {generic / sent:.1f}x "
            f"| {first['rows_resent']}/{rows} ({100 * first['rows_resent'] / rows:.1f}%) "
            f"| {first['pairs_resent']} | {first['max_held']} "
            f"| {max(r['ms_one_round'] for r in per_rank):.1f} "
            f"| {max(r['ms_generic'] for r in per_rank):.1f} "
            f"| {'yes' if first['same_sets'] else 'NO'} |"
        )
    for name, dist in DISTRIBUTIONS.items():
        print(f"- {name}: {dist.description}")


if __name__ == "__main__":
    main()
