"""The exact DCP top-k merge (``dcp.topk_merge``): fp32 scores on the wire, ids stay local.

Under DCP rank r of W holds tokens r, r + W, r + 2W, ... of each request (local index j is
token ``j * W + r``), so each rank can rank only its own tokens. The merge selects exactly the
set that the single-device ``indexer.topk`` selects on the request's fp32 scores in token
order: a higher score first; among equal scores the smaller token position (-0 equals +0); -inf
(and NaN, read as -inf) inside the row's range after every other score; fewer than k tokens:
all of them. The tokens each rank returns are its share of that set, best first.

Wire. Scores travel as fp32 values alone, each rank's sorted descending, NaN for "no candidate"
(a NaN score is read as -inf before, so NaN is free). Ids stay on their rank. Because a rank's
sorted list orders equal scores by local index, and token position ``j * W + r`` grows with j,
the selected tokens of every rank are a prefix of its sorted list: each rank only has to learn
how long its prefix is.

Rounds (every rank computes the same decisions from the same data, so every rank runs the same
collectives; rounds after the first run only for the rows that need them):

1. all-gather every rank's best ``c`` scores per row (``c = min(k, ceil(1.5 k / W))`` by
   default; ``candidates=k`` sends all k, the seed's AMD variant, and never needs round 2). The
   k-th largest gathered score is the round-1 threshold T1.
2. resend: a rank that sent c scores, its worst above T1 (or any such rank, when the row
   gathered at most k), may hold more of the top-k: it sends the rest of its local top-k scores
   by all-to-all. Every other rank's unsent scores are at most T1, and the final threshold is
   at least T1, so they are never selected; they can only tie, when its worst sent score is
   the final threshold: then its tie count is unknown, and the tie round treats it as k.
3. ties: with the final threshold T (the k-th largest known score), every rank knows how many
   scores each rank holds above T and at T, and how many T-ties the top-k still needs. One
   holder, or ties that all fit, need nothing more. Otherwise the tied tokens' positions are
   merged like the scores (smaller first, all distinct): each tied rank sends the local ids of
   its first ``ceil(1.5 needed / holders)`` tied tokens, every rank takes the needed-th
   smallest position received, and a rank whose last sent position is below it (it may hold
   more) sends the rest of its first ``min(ties, needed)``, in a second all-to-all.

Exactness: every score above T is selected, none below; at T the ``needed`` smallest positions
win, which is the single-device rule. A rank's selected ties are a prefix of its tied tokens,
so none beyond its first ``needed`` can win, and a rank that stopped sending at a position
above the needed-th smallest cannot hold a smaller one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hwrun.collectives.communicator import CollectiveError, Communicator

_SCORE_BYTES = 4  # fp32 on the wire
_INDEX_BYTES = 4  # int32 local indices in the tie round
_NO_CANDIDATE = float("nan")


@dataclass(frozen=True)
class TopkMergeResult:
    """This rank's share of the global top-k and what the merge cost.

    ``local_indices`` and ``num_local`` differ per rank; ``resend``, ``tie_round``,
    ``threshold`` and ``rounds`` are the same on every rank.
    """

    local_indices: torch.Tensor  # [R, k] int32 local ids in the top-k, best first, -1 padded
    num_local: torch.Tensor  # [R] int32: valid entries of local_indices per row
    resend: torch.Tensor  # [R, W] bool: rank w resent its remaining scores of row i (round 2)
    tie_round: torch.Tensor  # [R] bool: row i broke ties at the threshold by token position
    threshold: torch.Tensor  # [R] float32: the k-th score; NaN where every candidate is selected
    rounds: int  # collectives this merge ran (0 to 4: gather, resend, two for ties)
    bytes_sent: int  # payload this rank sent to its peers, every round


def candidates_per_rank(k: int, world_size: int) -> int:
    """c = min(k, ceil(1.5 * k / W)): the default round-1 scores each rank sends per row."""
    return min(k, math.ceil(1.5 * k / world_size))


def topk_merge(
    comm: Communicator,
    scores: torch.Tensor,  # [R, L_local] floating: this rank's tokens of each row's request
    k: int,
    *,
    lengths: torch.Tensor | None = None,  # [R] int: each row's context length L (global)
    candidates: int | None = None,
) -> TopkMergeResult:
    """Select exactly the single-device ``indexer.topk`` set of DCP-sharded scores.

    ``scores`` are compared as fp32 (lower precisions widen exactly). ``lengths`` (the same on
    every rank) limits row i to its request's tokens ``0 .. L_i - 1``: this rank's local columns
    ``j < ceil((L_i - rank) / W)``; later columns are ignored. Without it every column is a
    token of the row. ``candidates`` is the round-1 scores per rank per row (default
    :func:`candidates_per_rank`). See the module docstring for the rounds.
    """
    rank, world = comm.rank, comm.world_size
    rows, local_len = _check_inputs(scores, k, lengths, candidates, rank, world)
    device = scores.device
    if lengths is None:
        held = torch.full((rows,), local_len, dtype=torch.int64, device=device)
        width = k  # the peers' shares are unknown: any rank may fill k
    else:
        lengths = lengths.to(device=device, dtype=torch.int64)
        held = (lengths - rank + world - 1).div(world, rounding_mode="floor").clamp(min=0)
        longest = int(lengths.max()) if rows else 0
        width = min(k, -(-longest // world))  # rank 0 holds the most: ceil(L / W)
    mine = held.clamp(max=width)  # [R] this rank's candidates: its tokens, at most k

    # This rank's tokens sorted best first; a stable sort keeps equal scores in local-index
    # order, and columns outside the row (set to -inf) after its own -inf tokens.
    column = torch.arange(local_len, device=device)
    s = scores.float()
    s = torch.where(s.isnan() | (column >= held[:, None]), float("-inf"), s)
    ordered = torch.sort(s, dim=1, descending=True, stable=True)
    slot = torch.arange(width, device=device)
    values = _pad_cols(ordered.values, width, _NO_CANDIDATE)
    values = torch.where(slot < mine[:, None], values, _NO_CANDIDATE)  # [R, width]
    order = _pad_cols(ordered.indices, width, -1)  # [R, width] local ids

    resend = torch.zeros(rows, world, dtype=torch.bool, device=device)
    if lengths is not None and bool((lengths <= k).all()):
        # every row has at most k tokens (known to every rank): all are selected, nothing to send
        every = torch.full((rows,), _NO_CANDIDATE, device=device)
        return _result(order, mine, k, resend, resend[:, 0], every, 0, 0)

    c = min(candidates or candidates_per_rank(k, world), width)
    known = torch.full((world, rows, width), _NO_CANDIDATE, device=device)  # [W, R, width]
    known[:, :, :c] = comm.all_gather(values[:, :c].contiguous())
    _check_sorted(known)
    rounds, bytes_sent = 1, (world - 1) * rows * c * _SCORE_BYTES

    full = torch.zeros(world, rows, dtype=torch.bool, device=device)  # [W, R] may hold more
    if c < width:
        first_threshold, cut = _kth_score(known, k)
        worst = known[:, :, c - 1]  # [W, R], NaN where a rank had fewer than c
        full = ~worst.isnan()
        # a worst score equal to T1 leaves nothing above T1 unsent, only possible ties: those
        # are the tie round's business (below), so only a worst score above T1 resends
        resend = (full & (~cut | (worst > first_threshold))).T
    if bool(resend.any()):
        counts = resend.sum(0).tolist()
        payload = values[resend[:, rank], c:].contiguous()  # [rows this rank resends, width - c]
        received = comm.all_to_all([payload] * world, [(n, width - c) for n in counts])
        for sender, part in enumerate(received):
            known[sender, resend[:, sender], c:] = part
        _check_sorted(known)
        rounds += 1
        bytes_sent += (world - 1) * payload.numel() * _SCORE_BYTES

    threshold, cut = _kth_score(known, k)
    valid = ~known.isnan()
    above = (valid & (known > threshold[None, :, None])).sum(2)  # [W, R]
    ties = (known == threshold[None, :, None]).sum(2)  # [W, R]
    # a full rank that did not resend, its worst sent score at the threshold, may hold more
    # ties than it sent: count k for it (more than a row can take; it sends what it has)
    unsent_ties = full & ~resend.T & (known[:, :, c - 1] == threshold)
    ties = torch.where(unsent_ties, k, ties)
    needed = k - above.sum(0)  # [R] ties the top-k takes (rows that cut)
    taken = torch.minimum(ties, needed)  # [W, R] the first ties each rank could give
    holders = (ties > 0).sum(0)
    tie_round = cut & (holders >= 2) & (ties.sum(0) > needed)
    # one holder takes all it needs; ties that all fit are all taken
    chosen = taken[rank].clone()
    if bool(tie_round.any()):
        tied_rows = tie_round.nonzero().squeeze(1)
        chosen[tied_rows], collectives, sent = _break_ties(
            comm,
            values[tied_rows],
            order[tied_rows],
            threshold[tied_rows],
            above[:, tied_rows],
            taken[:, tied_rows],
            needed[tied_rows],
        )
        rounds += collectives
        bytes_sent += (world - 1) * sent * _INDEX_BYTES

    count = torch.where(cut, above[rank] + chosen, mine)
    threshold = torch.where(cut, threshold, _NO_CANDIDATE)
    return _result(order, count, k, resend, tie_round, threshold, rounds, bytes_sent)


def _break_ties(
    comm: Communicator,
    values: torch.Tensor,  # [n, width] this rank's sorted scores of the tied rows (NaN: none)
    order: torch.Tensor,  # [n, width] their local ids
    threshold: torch.Tensor,  # [n] the tied score
    above: torch.Tensor,  # [W, n] each rank's scores above the threshold
    taken: torch.Tensor,  # [W, n] each rank's ties that may be needed: min(ties, needed)
    needed: torch.Tensor,  # [n] ties the top-k takes
) -> tuple[torch.Tensor, int, int]:
    """The tie round: this rank's count of tied tokens among the ``needed`` smallest token
    positions of every rank's ties, the collectives run (1 or 2) and the local ids it sent.

    The merge of scores again, on positions (smaller first, all distinct): each tied rank sends
    its first ``ceil(1.5 needed / holders)`` tied ids (at most ``taken``); a rank whose last sent
    position is below the needed-th smallest received (or that sent them all, when too few were
    received) may hold more and sends the rest of its ``taken``. A rank whose tie count was
    unknown (more ties than it sent scores) pads with -1 where it has no more ties.
    """
    rank, world = comm.rank, comm.world_size
    n, width = order.shape
    span = int(taken.max())
    slot = torch.arange(span, device=order.device)
    position = above[rank][:, None] + slot
    inside = position.clamp(max=width - 1)
    tied = (position < width) & (values.gather(1, inside) == threshold[:, None])
    ids = torch.where(tied, order.gather(1, inside), -1)  # [n, span] this rank's ties, -1 padded
    holders = (taken > 0).sum(0)
    share = torch.minimum(
        taken, (3 * needed + 2 * holders - 1).div(2 * holders, rounding_mode="floor")
    )

    unused = torch.iinfo(torch.int64).max
    tokens = torch.full((world, n, span), unused, dtype=torch.int64, device=order.device)
    first = slot < share[:, :, None]  # [W, n, span]
    sent = _send_positions(comm, ids, first, tokens)
    kth = _nth_smallest(tokens, needed)
    last_slot = (share - 1).clamp(min=0)[:, :, None]
    last = tokens.gather(2, last_slot).squeeze(2)  # [W, n] each rank's last sent position
    more = (share < taken) & (last != unused) & ((kth == unused) | (last < kth))
    collectives = 1
    if bool(more.any()):
        rest = more[:, :, None] & ~first & (slot < taken[:, :, None])
        sent += _send_positions(comm, ids, rest, tokens)
        kth = _nth_smallest(tokens, needed)
        collectives = 2
    return (tokens[rank] <= kth[:, None]).sum(1), collectives, sent


def _send_positions(
    comm: Communicator,
    ids: torch.Tensor,  # [n, span] this rank's tied local ids, -1 padded
    slots: torch.Tensor,  # [W, n, span] bool: the slots each rank sends (the same on every rank)
    tokens: torch.Tensor,  # [W, n, span] int64 token positions received so far; filled here
) -> int:
    """All-to-all of every rank's ``ids[slots[rank]]``; returns how many ids this rank sent."""
    rank, world = comm.rank, comm.world_size
    payload = ids[slots[rank]].to(torch.int32)
    counts = slots.sum((1, 2)).tolist()
    received = comm.all_to_all([payload] * world, [(m,) for m in counts])
    unused = torch.iinfo(torch.int64).max
    for sender, part in enumerate(received):
        local = part.long()
        tokens[sender][slots[sender]] = torch.where(
            local >= 0, _token_position(local, sender, world), unused
        )
    return payload.numel()


def _nth_smallest(tokens: torch.Tensor, needed: torch.Tensor) -> torch.Tensor:
    """[n] the needed-th smallest position received per row (int64 max when too few)."""
    world, n, span = tokens.shape
    ranked = torch.sort(tokens.permute(1, 0, 2).reshape(n, world * span), dim=1).values
    return ranked.gather(1, (needed - 1)[:, None]).squeeze(1)


def _token_position(local: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The tie rule's order: token ``local * W + rank`` of the request (DCP's round-robin)."""
    return local * world + rank


def _check_sorted(known: torch.Tensor) -> None:
    # every rank's list must arrive as it was sent: scores non-increasing, then NaN padding
    valid = ~known.isnan()
    gap = valid[..., 1:] & ~valid[..., :-1]
    rising = valid[..., 1:] & (known[..., 1:] > known[..., :-1])
    if bool((gap | rising).any()):
        raise CollectiveError(
            "dcp.topk_merge received candidate scores out of order: the communicator returned "
            "data in a different layout than it was sent; check its all_gather / all_to_all "
            "against the Communicator docstrings"
        )


def _kth_score(known: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R] the k-th largest known score per row, and [R] whether the row has more than k."""
    rows = known.shape[1]
    valid = ~known.isnan()
    flat = torch.where(valid, known, float("-inf")).permute(1, 0, 2).reshape(rows, -1)
    if flat.shape[1] >= k:
        kth = torch.topk(flat, k, dim=1).values[:, -1]  # fillers are -inf: never above a score
    else:
        kth = torch.full((rows,), float("-inf"), device=known.device)
    return kth, valid.sum((0, 2)) > k


def _result(
    order: torch.Tensor,
    count: torch.Tensor,
    k: int,
    resend: torch.Tensor,
    tie_round: torch.Tensor,
    threshold: torch.Tensor,
    rounds: int,
    bytes_sent: int,
) -> TopkMergeResult:
    slot = torch.arange(k, device=order.device)
    local = torch.where(slot < count[:, None], _pad_cols(order, k, -1), -1)
    return TopkMergeResult(
        local_indices=local.to(torch.int32),
        num_local=count.to(torch.int32),
        resend=resend,
        tie_round=tie_round,
        threshold=threshold,
        rounds=rounds,
        bytes_sent=bytes_sent,
    )


def _check_inputs(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    candidates: int | None,
    rank: int,
    world: int,
) -> tuple[int, int]:
    if scores.dim() != 2 or not scores.is_floating_point():
        raise ValueError(
            f"dcp.topk_merge scores must be floating [R, L_local] (rows x this rank's tokens), "
            f"got {scores.dtype} {list(scores.shape)}"
        )
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise ValueError(
            f"dcp.topk_merge: k must be a positive int (2048 in the models), got {k!r}"
        )
    if candidates is not None and not 1 <= candidates <= k:
        raise ValueError(f"dcp.topk_merge: candidates must be in [1, k={k}], got {candidates}")
    rows, local_len = scores.shape
    if lengths is not None:
        if lengths.shape != (rows,) or lengths.is_floating_point():
            raise ValueError(
                f"dcp.topk_merge lengths must be an int tensor [R={rows}], got {lengths.dtype} "
                f"{list(lengths.shape)}"
            )
        if rows and int(lengths.min()) < 0:
            raise ValueError(f"dcp.topk_merge lengths must be >= 0, got {lengths.tolist()}")
        held = (lengths.long() - rank + world - 1).div(world, rounding_mode="floor")
        if rows and int(held.max()) > local_len:
            raise ValueError(
                f"dcp.topk_merge: rank {rank} of {world} holds ceil((L - {rank}) / {world}) = "
                f"{int(held.max())} tokens of a row of length {int(lengths.max())}, but scores "
                f"has only {local_len} columns; pass every local token's score"
            )
    return rows, local_len


def _pad_cols(x: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    if x.shape[1] >= width:
        return x[:, :width]
    pad = torch.full((x.shape[0], width - x.shape[1]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)
