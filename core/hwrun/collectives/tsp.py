"""Token-sharded prefill (TSP): move attention from "all tokens, H/W heads" to "T/W tokens, all
heads" and back, with the balanced causal split.

Under TP each rank holds H/W heads of every token; MLA's latent is shared by all heads, so every
rank would read the whole cache for a few heads. :func:`heads_to_tokens` gives each rank a
share of the tokens with all heads instead; :func:`tokens_to_heads` is its exact inverse. Causal
attention costs more for later tokens, so each request is cut into 2W contiguous pieces (as even
as integer sizes allow) and rank r takes pieces r and 2W-1-r: an early and a late piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hwrun.collectives.communicator import Communicator


@dataclass(frozen=True)
class TokenShardPlan:
    """Which of a step's T tokens each rank owns under the balanced causal split.

    ``token_indices[r]`` lists rank r's tokens (positions in the step's flattened T tokens):
    for each request in order, its piece r then its piece 2W-1-r.
    """

    world_size: int
    request_lens: tuple[int, ...]
    token_indices: tuple[torch.Tensor, ...]  # W x [T_r] int64

    @property
    def num_tokens(self) -> int:
        return sum(self.request_lens)

    def tokens_of(self, rank: int) -> int:
        return int(self.token_indices[rank].numel())


def piece_bounds(num_tokens: int, world_size: int) -> list[int]:
    """The 2W + 1 boundaries of a request's pieces: piece i is ``[b[i], b[i+1])``.

    ``b[i] = floor(i * n / 2W)``, so piece sizes differ by at most one token.
    """
    pieces = 2 * world_size
    return [i * num_tokens // pieces for i in range(pieces + 1)]


def balanced_plan(request_lens: Sequence[int], world_size: int) -> TokenShardPlan:
    """The balanced causal split of a step whose requests have ``request_lens`` new tokens."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if any(n < 0 for n in request_lens):
        raise ValueError(f"request lengths must be >= 0, got {list(request_lens)}")
    per_rank: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
    start = 0
    for n in request_lens:
        b = piece_bounds(n, world_size)
        for r in range(world_size):
            late = 2 * world_size - 1 - r
            per_rank[r].append(torch.arange(start + b[r], start + b[r + 1]))
            per_rank[r].append(torch.arange(start + b[late], start + b[late + 1]))
        start += n
    indices = tuple(
        torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64) for parts in per_rank
    )
    return TokenShardPlan(world_size, tuple(int(n) for n in request_lens), indices)


def causal_work(plan: TokenShardPlan) -> list[int]:
    """Per rank, the number of (query, key) pairs its tokens attend under causal masking.

    A token at position p of its request attends p + 1 keys.
    """
    position = torch.cat([torch.arange(n) for n in plan.request_lens] or [torch.zeros(0)])
    return [int((position[idx] + 1).sum()) for idx in plan.token_indices]


def heads_to_tokens(
    comm: Communicator,
    x: torch.Tensor,  # [T, H/W, D] every token, this rank's heads r*H/W .. (r+1)*H/W - 1
    plan: TokenShardPlan,
) -> torch.Tensor:  # [T_r, H, D] this rank's tokens (plan.token_indices[r]), all heads
    """The all-to-all from the head-sharded to the token-sharded layout."""
    _check(comm, x, plan, plan.num_tokens, "heads_to_tokens", "[T, H/W, ...]")
    world = comm.world_size
    chunks = [x[plan.token_indices[s].to(x.device)] for s in range(world)]
    mine = plan.tokens_of(comm.rank)
    parts = comm.all_to_all(chunks, [(mine, *x.shape[1:])] * world)
    return torch.cat(parts, dim=1)  # sender p's heads are heads p*H/W.., in rank order


def tokens_to_heads(
    comm: Communicator,
    y: torch.Tensor,  # [T_r, H, D] this rank's tokens, all heads
    plan: TokenShardPlan,
) -> torch.Tensor:  # [T, H/W, D] every token, this rank's heads
    """The all-to-all back from the token-sharded to the head-sharded layout."""
    world, rank = comm.world_size, comm.rank
    _check(comm, y, plan, plan.tokens_of(rank), "tokens_to_heads", "[T_r, H, ...]")
    if y.shape[1] % world:
        raise ValueError(
            f"tsp.tokens_to_heads splits {y.shape[1]} heads over {world} ranks; the head count "
            "must be divisible by W"
        )
    local_heads = y.shape[1] // world
    chunks = [y[:, s * local_heads : (s + 1) * local_heads] for s in range(world)]
    shapes = [(plan.tokens_of(p), local_heads, *y.shape[2:]) for p in range(world)]
    parts = comm.all_to_all(chunks, shapes)
    out = torch.empty((plan.num_tokens, local_heads, *y.shape[2:]), dtype=y.dtype, device=y.device)
    for p, part in enumerate(parts):
        out[plan.token_indices[p].to(y.device)] = part
    return out


def _check(
    comm: Communicator, x: torch.Tensor, plan: TokenShardPlan, rows: int, op: str, shape: str
) -> None:
    if plan.world_size != comm.world_size:
        raise ValueError(
            f"tsp.{op}: the plan is for W={plan.world_size} ranks but the communicator has "
            f"{comm.world_size}; build the plan with balanced_plan(lens, comm.world_size)"
        )
    if x.dim() < 2 or x.shape[0] != rows:
        raise ValueError(
            f"tsp.{op} expects {shape} with {rows} rows on rank {comm.rank}, got shape "
            f"{list(x.shape)}"
        )
