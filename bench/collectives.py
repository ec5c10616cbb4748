"""Benchmark of the DCP top-k merge: bytes per rank, rounds, resend and tie rates vs generic.

Runs W local gloo processes (default W = 8, k = 2048, 320 query rows = 64 requests x 5 query
tokens, 32K-token contexts sharded round-robin). For each score distribution it runs
``dcp.topk_merge`` twice (round 1 with the default c = ceil(1.5k/W) scores per rank, and with
all k: the seed's AMD variant) and the generic merge (every rank's full local top-k as fp32
score + int32 token id, all-gathered), checks all three select the same tokens, and prints
bytes each rank sends, how often the resend and tie rounds run, and the CPU time (gloo on CPU:
a correctness-scale timing, not a GPU figure).

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
    on the ranks ``0, stride, 2 stride, ...`` mod W), a recency and attention-sink bonus, or
    ``heads`` index heads with ``shift`` subtracted from q.k before the ReLU (ReLU zeros)."""

    description: str
    stride: int = 0
    gain: float = 1.0
    recency: bool = False
    heads: int = INDEX_HEADS
    shift: float = 0.0


DISTRIBUTIONS = {
    "relu-sum, iid keys": Distribution("Gaussian keys, 8 index heads of dim 32"),
    "relu-sum + recency + sinks": Distribution(
        "+2 on the last 4K tokens' scores, +10 on the first 4", recency=True
    ),
    "skewed: every 4th key x1.1": Distribution("at W = 8: ranks 0 and 4 favoured", 4, 1.1),
    "skewed: every 4th key x1.3": Distribution("at W = 8: ranks 0 and 4 favoured", 4, 1.3),
    "skewed: every 8th key x3": Distribution("at W = 8: every winner on rank 0", 8, 3.0),
    "relu zeros: 1 head, q.k - 12": Distribution(
        "about 2% of keys score > 0, the rest exactly 0: fewer than k, so the k-th score is a "
        "0 tied on every rank",
        heads=1,
        shift=12.0,
    ),
}


def local_scores(dist: Distribution, rows: int, context: int, comm: Communicator) -> torch.Tensor:
    """This rank's [rows, context / W] scores (the same global data on every rank: keys are
    drawn for all tokens, then sharded)."""
    g = torch.Generator().manual_seed(2048)
    q = torch.randn(rows, dist.heads, INDEX_DIM, generator=g)
    w = torch.rand(rows, dist.heads, generator=g)
    keys = torch.randn(context, INDEX_DIM, generator=g)
    positions = torch.arange(context)
    if dist.stride:
        keys[positions % dist.stride == 0] *= dist.gain
    mine = slice(comm.rank, None, comm.world_size)
    logits = (torch.einsum("rhd,ld->rhl", q, keys[mine]) - dist.shift).relu()
    scores = torch.einsum("rh,rhl->rl", w, logits)
    if dist.recency:
        pos = positions[mine]
        scores = scores + 2.0 * (pos >= context - 4096) + 10.0 * (pos < 4)
    return scores


def generic_merge(comm: Communicator, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """The baseline: all-gather every rank's local top-k (fp32 score, int32 global id); every
    rank takes the best k under indexer.topk's order (higher score, then smaller token
    position), as dcp.topk_merge does. Returns this rank's selected local indices [R, k] (-1
    padded) and the bytes it sent."""
    world, rank = comm.world_size, comm.rank
    m = min(k, scores.shape[1])
    top = torch.sort(scores.float(), dim=1, descending=True, stable=True)
    ids = dcp.local_to_global(top.indices[:, :m], rank, world).to(torch.int32)
    pair = torch.stack([top.values[:, :m], ids.view(torch.float32)], dim=-1)  # 8 bytes each
    gathered = comm.all_gather(pair)  # [W, R, m, 2]
    rows = scores.shape[0]
    values = gathered[..., 0].permute(1, 0, 2).reshape(rows, -1)
    tokens = gathered[..., 1].contiguous().view(torch.int32).permute(1, 0, 2)
    tokens = tokens.reshape(rows, -1).long()
    by_token = torch.argsort(tokens, dim=1)  # smaller position first among equal scores
    values, tokens = values.gather(1, by_token), tokens.gather(1, by_token)
    best = torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
    chosen = torch.gather(tokens, 1, best)
    local = torch.where(chosen % world == rank, chosen // world, -1)
    return local, (world - 1) * pair.numel() * 4


def _timed(comm: Communicator, iters: int, merge, *args, **kwargs):
    """``merge(*args, **kwargs)`` ``iters`` times, every rank starting together: its last result
    and the median milliseconds."""
    times = []
    for _ in range(iters):
        comm.barrier()
        start = time.perf_counter()
        out = merge(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return out, 1e3 * statistics.median(times)


def _bench_rank(comm: Communicator, k: int, rows: int, context: int, iters: int) -> list[dict]:
    report = []
    for name, dist in DISTRIBUTIONS.items():
        scores = local_scores(dist, rows, context, comm)
        merged, ms_one = _timed(comm, iters, dcp.topk_merge, comm, scores, k)
        every, ms_every = _timed(comm, iters, dcp.topk_merge, comm, scores, k, candidates=k)
        (generic, generic_bytes), ms_generic = _timed(comm, iters, generic_merge, comm, scores, k)
        sets = [
            set(x[x >= 0].tolist()) for x in (merged.local_indices, every.local_indices, generic)
        ]
        same = comm.all_reduce(torch.tensor([int(sets[0] == sets[1] == sets[2])]), "min").item()
        report.append(
            {
                "name": name,
                "bytes_one": merged.bytes_sent,
                "bytes_every": every.bytes_sent,
                "bytes_generic": generic_bytes,
                "rows_resent": int(merged.resend.any(1).sum()),
                "rows_tied": int(merged.tie_round.sum()),
                "rounds": (merged.rounds, every.rounds),
                "max_held": int(comm.all_reduce(merged.num_local.max(), "max")),
                "ms": (ms_one, ms_every, ms_generic),
                "same_sets": bool(same),
            }
        )
    return report


def _span(per_rank: list[dict], key: str) -> str:
    least, most = min(r[key] for r in per_rank), max(r[key] for r in per_rank)
    return f"{most:,}" if least == most else f"{least:,} to {most:,}"


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
        f"round 1 sends c={c} fp32 scores per row per peer (c=k: {k}) vs {k} x 8 bytes generic"
    )
    print(
        f"| distribution | bytes/rank c={c} | bytes/rank c=k | bytes/rank generic "
        f"| generic / c={c} (worst rank) | rows resent | rows tie round | rounds c={c}, c=k "
        f"| most top-k on one rank | ms c={c} | ms c=k | ms generic | same sets |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, name in enumerate(DISTRIBUTIONS):
        per_rank = [r[i] for r in ranks]
        first = per_rank[0]
        worst = max(r["bytes_one"] for r in per_rank)
        ms = [max(r["ms"][j] for r in per_rank) for j in range(3)]
        print(
            f"| {name} | {_span(per_rank, 'bytes_one')} | {_span(per_rank, 'bytes_every')} "
            f"| {first['bytes_generic']:,} | {first['bytes_generic'] / worst:.1f}x "
            f"| {first['rows_resent']}/{rows} | {first['rows_tied']}/{rows} "
            f"| {first['rounds'][0]}, {first['rounds'][1]} | {first['max_held']} "
            f"| {ms[0]:.1f} | {ms[1]:.1f} | {ms[2]:.1f} "
            f"| {'yes' if all(r['same_sets'] for r in per_rank) else 'NO'} |"
        )
    for name, dist in DISTRIBUTIONS.items():
        print(f"- {name}: {dist.description}")


if __name__ == "__main__":
    main()
