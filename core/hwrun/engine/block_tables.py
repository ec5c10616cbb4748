"""Decode block tables as int32 arrays, kept across steps and extended by the new blocks only.

A decode row's block table is the whole context's: 2,048 block ids at 128K tokens. Turning 64
such Python lists into one tensor every step cost milliseconds of host time (numpy converts a
list one int at a time), more than some steps' GPU time. A sequence's table only grows between
the times the block manager frees it (finish or preemption, which bump ``table_epoch``), so the
runner keeps each sequence's table as an array and appends what the scheduler added since.
"""

from __future__ import annotations

import numpy as np

from hwrun.engine.batch import ScheduledChunk


class _Table:
    __slots__ = ("epoch", "ids", "length")

    def __init__(self, epoch: int, blocks: list[int]):
        self.epoch = epoch
        self.ids = np.empty(max(16, 2 * len(blocks)), dtype=np.int32)
        self.length = 0
        self.extend(blocks)

    def extend(self, blocks: list[int]) -> None:
        """Append ``blocks[self.length:]``."""
        end = len(blocks)
        if end > self.ids.shape[0]:
            grown = np.empty(2 * end, dtype=np.int32)
            grown[: self.length] = self.ids[: self.length]
            self.ids = grown
        self.ids[self.length : end] = blocks[self.length :]
        self.length = end


class BlockTables:
    """Each decoding sequence's block table, as the runner last saw it."""

    def __init__(self) -> None:
        self._tables: dict[int, _Table] = {}

    def fill(self, chunks: list[ScheduledChunk], block_size: int, out: np.ndarray) -> None:
        """Row i of ``out`` (int32 [>= len(chunks), width]) := the blocks chunk i's positions
        use, -1 past them; rows past the chunks are left as they are. Forgets sequences not
        in ``chunks`` (finished or not decoding: rebuilt if they come back)."""
        tables, known = {}, self._tables
        # One fill of every row, then each row's blocks over it: a fill per row's tail cost
        # ~0.9 us of numpy call each, 64 of them a step, where one fill of 64 x 640 is ~9 us.
        out[: len(chunks)] = -1
        for row, chunk in enumerate(chunks):
            table = known.get(chunk.seq_id)
            blocks = chunk.block_table
            if table is None or table.epoch != chunk.table_epoch or len(blocks) < table.length:
                table = _Table(chunk.table_epoch, blocks)
            elif len(blocks) > table.length:
                table.extend(blocks)
            tables[chunk.seq_id] = table
            used = -(-chunk.end // block_size)
            out[row, :used] = table.ids[:used]
        self._tables = tables
