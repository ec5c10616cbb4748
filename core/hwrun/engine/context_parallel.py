"""Decode context parallelism (DCP) in the engine: where a rank's tokens live, and how the ranks
join their attention.

The model calls a :class:`ContextShard` at the few points where a token-sharded KV cache
changes a step (``DeepseekV32._decode_attention`` and ``_prefill_attention``); the model runner
asks it where each token's KV is written and read. Everything else in the model is the same on
every rank: DCP replicates the weights and splits no heads.

:class:`ContextShard` itself is one rank holding every token (alone, or a tensor-parallel rank):
the identity at each point. :class:`TokenShardedContext` is rank r of W under DCP, with
``hwrun.collectives.dcp``'s ownership: token t lives on rank ``t % W`` at local index ``t // W``.
Per layer:

- decode: each rank scores its own keys (``indexer.logits_paged`` over its pages, with its local
  lengths); the ranks merge the exact global top-k (``dcp.topk_merge``: the set the reference
  ``indexer.topk`` selects on one rank, equal scores by smallest token position); each rank
  attends over the selected tokens it holds (``sparse_mla.decode``: a rank holding none of a
  row's selection returns out 0, lse -inf); the parts are merged by their LSE (one all-gather,
  then the op table's ``attn.lse_combine``, the same fold on every rank);
- prefill: each rank reads its own rows of every prefill chunk's context (index keys and latent
  rows, the stored bytes), one all-gather rebuilds each context in token order on every rank,
  and the prefill runs as on one rank over it (replicated compute; a rank writes only its own
  tokens), so prefill output equals one rank's bit for bit.

Blocks: the scheduler sees blocks of ``W * block_size`` tokens, and one block-table entry means
the same block number on every rank: on rank r it holds that block's local tokens
``i * block_size .. (i + 1) * block_size - 1`` (global tokens ``t`` with
``t // (W * block_size) == i`` and ``t % W == r``). So the scheduler, the block manager and the
prefix cache work unchanged, and every rank's pool has the same number of blocks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from hwrun.collectives import dcp
from hwrun.collectives.communicator import Communicator
from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.op_table import OpTable

if TYPE_CHECKING:
    from hwrun.engine.model import PrefillRows


class ContextShard:
    """One rank holds every token of every request: nothing to join."""

    rank: int = 0
    world: int = 1

    # -- addressing (the model runner) ---------------------------------------------------------

    def scheduler_block_size(self, block_size: int) -> int:
        """Tokens per block as the scheduler counts them: every rank's share of a block."""
        return block_size * self.world

    def local_length(self, context_len: int) -> int:
        """Tokens of a ``context_len``-token request this rank stores."""
        return dcp.local_length(context_len, self.rank, self.world)

    def write_slot(self, chunk: ScheduledChunk, position: int, block_size: int) -> int:
        """The local cache slot of ``position``; -1 (the write ops skip it) on other ranks."""
        if position % self.world != self.rank:
            return -1
        local = position // self.world
        return chunk.block_table[local // block_size] * block_size + local % block_size

    def context_slots(self, chunk: ScheduledChunk, block_size: int) -> torch.Tensor:
        """[local_length(end)] int64: the local cache slots of this rank's tokens among
        positions ``0 .. chunk.end - 1``, in token order (vectorized: a prefill chunk late in a
        long prompt reads its whole context)."""
        local = torch.arange(self.local_length(chunk.end))
        blocks = torch.tensor(chunk.block_table[: -(-len(local) // block_size)], dtype=torch.int64)
        return blocks[local // block_size] * block_size + local % block_size

    # -- the model's attention -----------------------------------------------------------------

    def local_lengths(
        self,
        context_lens: torch.Tensor,  # [B] int32, each request's tokens (global)
        max_context: int,
    ) -> tuple[torch.Tensor, int]:  # [B] int32 this rank's tokens of each, and their bound
        return context_lens, max_context

    def select(
        self,
        ops: OpTable,
        logits: torch.Tensor,  # [B, L_local] float32 indexer scores of this rank's tokens
        context_lens: torch.Tensor,  # [B] int32, each row's tokens (global)
        k: int,
        starts: torch.Tensor | None = None,  # [B] int32 zeros, when the caller keeps them
    ) -> torch.Tensor:  # [B, k] int32 local positions of this rank's share of the top-k, -1 pad
        """The global top-k of each row, as the local positions this rank holds."""
        if starts is None:
            starts = torch.zeros_like(context_lens)
        return ops["indexer.topk"](logits, starts, context_lens, k)

    def combine(
        self,
        ops: OpTable,
        out: torch.Tensor,  # [B, s, H, 512] attention over this rank's selected tokens
        lse: torch.Tensor,  # [B, s, H] float32, -inf where this rank held none of them
    ) -> torch.Tensor:  # [B, s, H, 512] attention over every selected token
        return out

    def gather(
        self,
        rows: list[torch.Tensor],  # each [local rows of every chunk's context, ...], as stored
        prefill: PrefillRows,
    ) -> list[torch.Tensor]:  # each [sum of the chunks' context lengths, ...], in token order
        """Every prefill chunk's whole context, from this rank's stored rows of it."""
        return rows


class TokenShardedContext(ContextShard):
    """Rank ``comm.rank`` of a DCP group of ``comm.world_size``: token t on rank ``t % W``."""

    def __init__(self, comm: Communicator):
        if comm.world_size < 2:
            raise ValueError(f"a DCP group needs at least 2 ranks, got {comm.world_size}")
        self.comm = comm
        self.rank, self.world = comm.rank, comm.world_size

    def local_lengths(
        self, context_lens: torch.Tensor, max_context: int
    ) -> tuple[torch.Tensor, int]:
        local = (context_lens - self.rank + self.world - 1).div(self.world, rounding_mode="floor")
        return local.clamp(min=0).to(context_lens.dtype), -(-max_context // self.world)

    def select(
        self,
        ops: OpTable,
        logits: torch.Tensor,
        context_lens: torch.Tensor,
        k: int,
        starts: torch.Tensor | None = None,  # unused: every rank's window starts at 0
    ) -> torch.Tensor:
        # exactly the set the reference indexer.topk selects on the whole row (a platform's
        # topk may break exact ties otherwise; conformance compares its sets with the reference)
        return dcp.topk_merge(self.comm, logits, k, lengths=context_lens).local_indices

    def combine(self, ops: OpTable, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        merged, _ = dcp.lse_combine(self.comm, out, lse, merge=ops["attn.lse_combine"])
        return merged

    def gather(self, rows: list[torch.Tensor], prefill: PrefillRows) -> list[torch.Tensor]:
        dtypes = {r.dtype for r in rows}
        if len(dtypes) != 1:
            raise ValueError(f"gather takes rows of one dtype (the stored bytes), got {dtypes}")
        # explicit widths: a rank may hold no row of the step's contexts (0 x -1 is ambiguous)
        flat = [r.reshape(r.shape[0], math.prod(r.shape[1:])) for r in rows]
        # one all-gather for every tensor of every chunk
        lengths = prefill_context_lens(prefill)
        whole = dcp.gather_contexts(self.comm, torch.cat(flat, dim=1), lengths)
        parts = whole.split([f.shape[1] for f in flat], dim=1)
        return [p.reshape(p.shape[0], *r.shape[1:]) for p, r in zip(parts, rows, strict=True)]


def prefill_context_lens(prefill: PrefillRows) -> list[int]:
    """Each prefill chunk's context length (its end position), in the step's order.

    A chunk's rows share one ``key_starts`` (where its context starts in the gathered run) and
    its last row's ``key_ends`` is one past the chunk's last position in that run.
    """
    _, counts = torch.unique_consecutive(prefill.key_starts, return_counts=True)
    last_rows = counts.cumsum(0) - 1
    return (prefill.key_ends[last_rows] - prefill.key_starts[last_rows]).tolist()
