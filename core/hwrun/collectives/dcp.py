"""Decode context parallelism (DCP): token sharding, context gather, top-k merge, LSE combine.

Ownership: rank r of W stores every W-th token of each request, token t on rank ``t % W`` at
local index ``t // W``. Per layer each rank ranks its own tokens, the ranks merge the global
top-k exactly (:func:`topk_merge`), each attends over the selected tokens it holds, and the
partial outputs are combined by their log-sum-exp (:func:`lse_combine`). Prefill under DCP can
instead gather the step's context (:func:`gather_context`) and run the token-sharded prefill.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwrun.collectives.communicator import Communicator
from hwrun.collectives.topk_merge import TopkMergeResult, candidates_per_rank, topk_merge
from hwrun.ops import attn

__all__ = [
    "TopkMergeResult",
    "candidates_per_rank",
    "gather_context",
    "gather_contexts",
    "local_length",
    "local_to_global",
    "lse_combine",
    "owner_rank",
    "shard_context",
    "topk_merge",
]


def owner_rank(tokens: torch.Tensor, world_size: int) -> torch.Tensor:
    """Rank holding each token position: ``t % W``."""
    return tokens % world_size


def local_length(context_len: int, rank: int, world_size: int) -> int:
    """Tokens of a ``context_len``-token request that ``rank`` stores: ``ceil((L - r) / W)``."""
    return max(0, -(-(context_len - rank) // world_size))


def local_to_global(
    local: torch.Tensor,  # any shape, int: local indices on ``rank``, -1 for padding
    rank: int,
    world_size: int,
) -> torch.Tensor:
    """Global token positions ``j * W + rank``; -1 stays -1."""
    return torch.where(local < 0, local, local * world_size + rank)


def shard_context(
    context: torch.Tensor,  # [L, ...] one request's per-token rows, in token order
    rank: int,
    world_size: int,
) -> torch.Tensor:
    """The rows ``rank`` stores: ``context[rank::W]``, ``[local_length(L, rank, W), ...]``."""
    return context[rank::world_size]


def gather_context(
    comm: Communicator,
    local: torch.Tensor,  # [local_length(L, rank, W), ...] this rank's rows of one request
    context_len: int,
) -> torch.Tensor:
    """Every rank's rows of one request, back in token order: ``[L, ...]`` on every rank.

    Works for any row type (packed uint8 cache rows included): rows are only moved.
    """
    return gather_contexts(comm, local, [context_len])


def gather_contexts(
    comm: Communicator,
    local: torch.Tensor,  # [sum_i local_length(L_i, rank, W), ...] this rank's rows, by request
    context_lens: list[int],  # L_i of each request, the same on every rank
) -> torch.Tensor:
    """:func:`gather_context` of several requests in one all-gather: ``[sum_i L_i, ...]``, each
    request's rows in token order, the requests in the given order, on every rank.

    ``local`` holds this rank's rows of request 0, then of request 1, and so on.
    """
    world, rank = comm.world_size, comm.rank
    held = [local_length(length, rank, world) for length in context_lens]
    if local.shape[0] != sum(held):
        raise ValueError(
            f"dcp.gather_context: rank {rank} of {world} stores {sum(held)} of the tokens of "
            f"requests of {context_lens} tokens, got {local.shape[0]} rows "
            f"(shape {list(local.shape)})"
        )
    rest = local.shape[1:]
    widths = [local_length(length, 0, world) for length in context_lens]  # rank 0 stores most
    padded = torch.zeros((sum(widths), *rest), dtype=local.dtype, device=local.device)
    source, target = 0, 0
    for count, width in zip(held, widths, strict=True):
        padded[target : target + count] = local[source : source + count]
        source, target = source + count, target + width
    gathered = comm.all_gather(padded)  # [W, sum(widths), ...]
    runs, start = [], 0
    for length, width in zip(context_lens, widths, strict=True):
        # gathered[r, j] is token j * W + r: swap to [width, W] and the order is token order
        run = gathered[:, start : start + width].transpose(0, 1).reshape(width * world, *rest)
        runs.append(run[:length])
        start += width
    return torch.cat(runs) if runs else padded


def lse_combine(
    comm: Communicator,
    out: torch.Tensor,  # [..., H, Dv] this rank's attention output over its own tokens
    lse: torch.Tensor,  # [..., H] float32 natural-log LSE of it; -inf where it saw no token
    *,
    heads_sharded: bool = False,
    merge: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = (
        attn.lse_combine
    ),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine every rank's partial attention into the attention over all their tokens.

    ``heads_sharded=False``: one all-gather, every rank gets ``[..., H, Dv]`` and ``[..., H]``.
    ``heads_sharded=True``: one all-to-all, rank r gets heads ``r*H/W .. (r+1)*H/W - 1``
    (``[..., H/W, Dv]``), the layout a head-sharded output projection reads; H must divide by W.
    The merge is ``merge``, an ``attn.lse_combine`` impl (default the reference,
    :func:`hwrun.ops.attn.lse_combine`; the engine passes its op table's), on the fp32 parts
    stacked in rank order: parts with lse -inf contribute nothing; when every part is -inf the
    output is 0 and the lse -inf.
    The output has ``out``'s dtype, the lse is float32.
    """
    if lse.shape != out.shape[:-1]:
        raise ValueError(
            f"dcp.lse_combine: lse must be out's shape without the last dim, {list(out.shape[:-1])}"
            f", got {list(lse.shape)}"
        )
    world = comm.world_size
    # out and lse travel together as one fp32 tensor: one collective instead of two
    packed = torch.cat([out.float(), lse.float().unsqueeze(-1)], dim=-1)  # [..., H, Dv + 1]
    if heads_sharded:
        heads = out.shape[-2]
        if heads % world:
            raise ValueError(
                f"dcp.lse_combine(heads_sharded=True) splits {heads} heads over {world} ranks; "
                "use a head count divisible by W or heads_sharded=False"
            )
        chunks = list(packed.split(heads // world, dim=-2))
        parts = torch.stack(comm.all_to_all(chunks, [chunks[0].shape] * world))
    else:
        parts = comm.all_gather(packed)  # [W, ..., H, Dv + 1]
    # every rank merges the same parts in rank order: the same bits on every rank
    merged_out, merged_lse = merge(parts[..., :-1], parts[..., -1].contiguous())
    return merged_out.to(out.dtype), merged_lse
