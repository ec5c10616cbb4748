"""The contract between the scheduler and the model runner: what one step computes.

A step is a list of :class:`ScheduledChunk`, one per scheduled sequence: a run of consecutive
positions of that sequence whose tokens are known (a prefill chunk, or the one new token of a
decode). The runner writes their KV into the sequence's blocks, attends over everything before
them, and returns the logits the sampler needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScheduledChunk:
    """Positions ``[start, start + len(token_ids))`` of one sequence, computed this step."""

    seq_id: int
    token_ids: list[int]  # the tokens at those positions
    start: int  # position of token_ids[0]; every earlier position is already in the cache
    block_table: list[int]  # the sequence's KV blocks, covering at least start + len(token_ids)
    needs_logits: bool  # the chunk ends at the sequence's last known token: sample after it
    all_logits: bool = False  # logits at every position of the chunk (prompt logprobs)
    # Bumped each time the sequence's blocks are freed: within one epoch its block table only
    # grows, so the runner may keep it between steps and append the new blocks only.
    table_epoch: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        """One new token after a cached context: the decode path (paged indexer, cache slots)."""
        return len(self.token_ids) == 1 and self.start > 0

    def slot(self, position: int, block_size: int) -> int:
        """The cache slot of ``position``: row ``position % block_size`` of its block."""
        return self.block_table[position // block_size] * block_size + position % block_size


@dataclass
class ChunkLogits:
    """Logits of one chunk: ``[n, V]`` float32 for every position when ``all_logits``, else
    ``[1, V]`` for the last position, or None when the chunk needs none."""

    seq_id: int
    logits: torch.Tensor | None
