"""The contract between the scheduler and the model runner: what one step computes.

A step is a list of :class:`ScheduledChunk`, one per scheduled sequence: a run of consecutive
positions of that sequence whose tokens are known (a prefill chunk, or the one new token of a
decode). The runner writes their KV into the sequence's blocks, attends over everything before
them, and returns the logits the sampler needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hwrun.engine.host_copy import to_device


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


@dataclass(slots=True)
class ChunkLogits:
    """Logits of one chunk, as rows of its step's logits: ``[n, V]`` float32 for every position
    when ``all_logits``, else ``[1, V]`` for the last position, or None when the chunk needs
    none.

    A runner computes a step's logits as one tensor; each chunk names its rows of it instead of
    holding a view (64 views a decode step cost ~0.2-0.4 ms of host time on the H200's host), and
    :func:`last_position_logits` takes the rows the sampler needs in one operation."""

    seq_id: int
    step_logits: torch.Tensor | None  # [R, V] float32: the step's logits, shared by its chunks
    rows: range = range(0)  # this chunk's rows of step_logits, one per position, in order

    @property
    def logits(self) -> torch.Tensor | None:
        """``[n, V]``: this chunk's rows (a view), or None."""
        if self.step_logits is None:
            return None
        return self.step_logits[self.rows.start : self.rows.stop]


def last_position_logits(results: list[ChunkLogits]) -> torch.Tensor:
    """``[len(results), V]``: row i is the logits of ``results[i]``'s last position (each has
    logits), laid out as a stack of those rows would be (row i at ``i * V`` of its storage's
    start): CUDA's softmax splits a row for its vectorized loads by the row's address
    alignment, so the order it adds the row in can depend on where the row starts, and a
    sampled token or its logprobs must not change with how the rows were gathered. When
    they are rows of one step's tensor, in one operation: the tensor itself or a leading slice
    of it (no copy) when they are its first rows in order, else one ``index_select``; otherwise
    (a runner that gives each chunk its own tensor) stacked."""
    step = results[0].step_logits
    if any(result.step_logits is not step for result in results):
        return torch.stack([result.logits[-1] for result in results])
    last = [result.rows.stop - 1 for result in results]
    if last == list(range(len(last))):
        return step if len(last) == step.shape[0] else step[: len(last)]
    return step.index_select(0, to_device(last, torch.int64, step.device))
