"""The exact one-round DCP top-k merge (``dcp.topk_merge``).

Under DCP rank r of W holds tokens r, r + W, r + 2W, ... (local index j is global token
j * W + r), so each rank can rank only its own tokens. The generic merge sends every rank's full
local top-k as fp32 score + int32 id pairs (8 bytes * k per row per peer). This merge sends
``c = min(k, ceil(1.5 * k / W))`` 32-bit words per row per peer, about ``4W/3`` times fewer bytes
(10.7x at W = 8), and stays exact.

Order. Scores are rounded to bf16 (round to nearest even); -0 counts as +0; a token whose bf16
score is -inf or NaN is never selected. Candidates are ordered by score (higher first), then by
rank (lower first), then by local index (lower first). Every rank applies the same order, so
every rank selects the same set: exactly ``min(k, number of selectable tokens)`` tokens.

Packing. A word is ``(score16 << 16) | (0xFFFF - ordinal)``, sent as int32. ``score16`` is the
bf16 bit pattern made order-preserving (negative: all bits flipped; positive: sign bit set), 0
for "no candidate"; ``ordinal`` is the candidate's position in its rank's sorted local list
(ids stay local: a receiver learns ranks and ordinals, never token ids). Within a rank the
ordinal order is the local-index order among equal scores, so a receiver orders candidates by
``(score16, rank, ordinal)`` without the ids. Ordinals need k <= 65536.

Rounds. Round 1 all-gathers every rank's best c words per row; each rank takes the k-th best
as the threshold. A rank that sent c candidates, all strictly better than that threshold (or all
selected because the row has fewer than k candidates), may hold more of the top-k than it sent:
every rank computes the same flags, and round 2 (only when some row is flagged) sends the
flagged rows' remaining local top-k words (ordinals c..k-1) by all-to-all. Ranks not flagged
cannot hold more: their worst sent candidate already lost to the round-1 threshold, which the
final threshold can only raise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hwrun.collectives.communicator import CollectiveError, Communicator

MAX_K = 1 << 16  # ordinals live in 16 bits
_WORD_BYTES = 4
_NO_CANDIDATE = 0


@dataclass(frozen=True)
class TopkMergeResult:
    """This rank's share of the global top-k and what the merge cost.

    ``local_indices`` and ``num_local`` differ per rank; ``resend`` and ``threshold`` are the
    same on every rank.
    """

    local_indices: torch.Tensor  # [R, k] int32 local ids in the top-k, best first, -1 padded
    num_local: torch.Tensor  # [R] int32: valid entries of local_indices per row
    resend: torch.Tensor  # [R, W] bool: rank w resent row i in round 2
    threshold: torch.Tensor  # [R] int64: key of the k-th selected candidate (1: row has < k)
    bytes_sent: int  # payload this rank sent to its peers, both rounds


def candidates_per_rank(k: int, world_size: int) -> int:
    """c = min(k, ceil(1.5 * k / W)): the round-1 candidates each rank sends per row."""
    return min(k, math.ceil(1.5 * k / world_size))


def orderable_bf16(scores: torch.Tensor) -> torch.Tensor:
    """bf16-rounded scores as int64 keys in [0, 0xFFFF] whose order is the score order.

    -0 and +0 map to one key; -inf and NaN (never selected) map to 0.
    """
    s = scores.float()
    s = torch.where(torch.isnan(s), float("-inf"), s) + 0.0  # + 0.0 turns -0 into +0
    bits = s.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    key = torch.where(bits >= 0x8000, 0xFFFF - bits, bits | 0x8000)
    neg_inf_key = 0xFFFF - 0xFF80  # -inf sorts below every finite bf16
    return torch.where(key <= neg_inf_key, _NO_CANDIDATE, key)


def merge_key(
    score16: torch.Tensor, rank: int | torch.Tensor, ordinal: torch.Tensor
) -> torch.Tensor:
    """The total order every rank applies: score, then lower rank, then lower ordinal.

    int64 keys, unique per (rank, ordinal); 0 where ``score16`` is 0 (no candidate).
    """
    key = (score16 << 32) | ((0xFFFF - rank) << 16) | (0xFFFF - ordinal)
    return torch.where(score16 == _NO_CANDIDATE, 0, key)


def topk_merge(
    comm: Communicator,
    scores: torch.Tensor,  # [R, L_local] float32 or bfloat16: this rank's tokens, -inf where unseen
    k: int,
) -> TopkMergeResult:
    """Select the exact global top-k of DCP-sharded scores; see the module docstring."""
    rank, world = comm.rank, comm.world_size
    if scores.dim() != 2:
        raise ValueError(
            f"dcp.topk_merge scores must be [R, L_local] (rows x this rank's tokens), got shape "
            f"{list(scores.shape)}"
        )
    if not 1 <= k <= MAX_K:
        raise ValueError(
            f"dcp.topk_merge packs ordinals in 16 bits: k must be in [1, {MAX_K}], got {k}"
        )
    rows, local_len = scores.shape
    device = scores.device
    c = candidates_per_rank(k, world)

    # This rank's sorted local top-k: ties by lower local index (unique int64 keys, so topk's
    # unspecified tie order never matters).
    score16 = orderable_bf16(scores)
    local_ids = torch.arange(local_len, device=device, dtype=torch.int64)
    m = min(k, local_len)
    local_order = torch.topk((score16 << 32) | (0xFFFFFFFF - local_ids), m, dim=1).indices
    sorted16 = _pad_cols(torch.gather(score16, 1, local_order), k)  # [R, k]
    ordinals = torch.arange(k, device=device, dtype=torch.int64)
    words = torch.where(sorted16 == _NO_CANDIDATE, 0, (sorted16 << 16) | (0xFFFF - ordinals))

    gathered = comm.all_gather(_to_int32(words[:, :c]))  # [W, R, c]
    ranks = torch.arange(world, device=device, dtype=torch.int64).view(world, 1, 1)
    round1 = _keys_from_words(_from_int32(gathered), ranks, 0)  # [W, R, c]
    threshold = _kth_key(round1.permute(1, 0, 2).reshape(rows, -1), k)
    last = round1[:, :, c - 1].T  # [R, W]: each rank's worst sent candidate
    # threshold is 1 on rows with fewer than k candidates, so there every full sender resends
    resend = last > threshold[:, None] if c < k else torch.zeros_like(last, dtype=torch.bool)

    bytes_sent = (world - 1) * rows * c * _WORD_BYTES
    if bool(resend.any()):
        counts = resend.sum(0).tolist()
        mine = resend[:, rank].nonzero().squeeze(1)
        payload = _to_int32(words[mine, c:])  # [rows this rank resends, k - c]
        received = comm.all_to_all([payload] * world, [(n, k - c) for n in counts])
        bytes_sent += (world - 1) * payload.numel() * _WORD_BYTES
        extra = torch.zeros(world, rows, k - c, dtype=torch.int64, device=device)
        for sender, part in enumerate(received):
            extra[sender, resend[:, sender]] = _from_int32(part)
        round2 = _keys_from_words(extra, ranks, c)
        again = resend.any(1)
        both = torch.cat([round1, round2], dim=2)[:, again]  # [W, rows again, k]
        threshold[again] = _kth_key(both.permute(1, 0, 2).reshape(int(again.sum()), -1), k)

    own = merge_key(sorted16, rank, ordinals)  # [R, k], keys of this rank's sorted local list
    selected = (own != 0) & (own >= threshold[:, None])  # a prefix of each row
    order = _pad_cols(local_order, k, fill=-1)
    local_indices = torch.where(selected, order, -1).to(torch.int32)
    return TopkMergeResult(
        local_indices=local_indices,
        num_local=selected.sum(1).to(torch.int32),
        resend=resend,
        threshold=threshold,
        bytes_sent=bytes_sent,
    )


def _keys_from_words(words: torch.Tensor, ranks: torch.Tensor, first_ordinal: int) -> torch.Tensor:
    # words [W, R, n] int64 in [0, 2^32); the ordinal is recovered from the word itself, and
    # checked against its slot so a communicator that reorders data cannot go unnoticed.
    score16 = words >> 16
    ordinal = 0xFFFF - (words & 0xFFFF)
    slots = torch.arange(first_ordinal, first_ordinal + words.shape[2], device=words.device)
    if bool(((ordinal != slots) & (score16 != _NO_CANDIDATE)).any()):
        raise CollectiveError(
            "dcp.topk_merge received candidates out of order: the communicator returned data in "
            "a different layout than it was sent; check its all_gather / all_to_all against "
            "the Communicator docstrings"
        )
    return merge_key(score16, ranks, ordinal)


def _kth_key(keys: torch.Tensor, k: int) -> torch.Tensor:
    """[R] the k-th largest key per row, or 1 (select every candidate) when a row has fewer."""
    valid = (keys != 0).sum(1)
    kth = torch.topk(keys, min(k, keys.shape[1]), dim=1).values[:, -1]
    return torch.where(valid >= k, kth, torch.ones_like(kth))


def _pad_cols(x: torch.Tensor, width: int, fill: int = 0) -> torch.Tensor:
    if x.shape[1] >= width:
        return x[:, :width]
    pad = torch.full((x.shape[0], width - x.shape[1]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    # uint32 bit patterns carried in int32 (collectives do not all support uint32)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32).contiguous()


def _from_int32(words: torch.Tensor) -> torch.Tensor:
    return words.to(torch.int64) & 0xFFFFFFFF
