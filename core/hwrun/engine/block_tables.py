"""Decode block tables kept across steps as rows of one int32 pool, a step's table taken whole.

A decode row's block table is the whole context's: 2,048 block ids at 128K tokens. Turning 64
such Python lists into one tensor every step cost milliseconds of host time (numpy converts a
list one int at a time), more than some steps' GPU time. A sequence's table only grows between
the times the block manager frees it (finish or preemption, which bump ``table_epoch``), so the
runner keeps each decoding sequence's table as a row of a 2-D int32 pool, -1 past its blocks,
and writes into it only the blocks the scheduler added since. A step's table is then its
chunks' rows of the pool, copied in one ``np.take``: a numpy slice per row cost ~1.5 us each,
64 a step, where the take of 64 x 513 ids is ~10 us (development machine).
"""

from __future__ import annotations

import numpy as np

from hwrun.engine.batch import ScheduledChunk


class _Row:
    """A sequence's row of the pool: its first ``length`` entries are its table (epoch
    ``epoch``), the rest -1."""

    __slots__ = ("epoch", "index", "length")

    def __init__(self, index: int, epoch: int):
        self.index = index
        self.epoch = epoch
        self.length = 0


class BlockTables:
    """Each decoding sequence's block table, as the runner last saw it."""

    def __init__(self) -> None:
        self._pool = np.full((0, 0), -1, dtype=np.int32)  # [rows, width]: -1 past each table
        self._rows: dict[int, _Row] = {}  # seq_id -> its row
        self._free: list[int] = []  # rows of no sequence, all -1

    def fill(self, chunks: list[ScheduledChunk], block_size: int, out: np.ndarray) -> None:
        """Row i of ``out`` (int32 [>= len(chunks), width]) := the blocks chunk i's positions
        use, -1 past them; rows past the chunks are left as they are. ``width`` must hold
        those blocks, and ``chunks`` hold one chunk per sequence (as a scheduled step does).
        Forgets sequences not in ``chunks`` (finished or not decoding: rebuilt if they come
        back)."""
        known, placed, rows, past_use, new = self._rows, {}, [], [], 0
        if out.shape[1] > self._pool.shape[1]:
            self._resize(self._pool.shape[0], out.shape[1])
        # The loop is what a step costs per row: a new, freed or grown table takes _place.
        for chunk in chunks:
            entry = known.get(chunk.seq_id)
            blocks = chunk.block_table
            length = len(blocks)
            if entry is None or entry.epoch != chunk.table_epoch or entry.length != length:
                new += entry is None
                entry = self._place(entry, chunk)
            placed[chunk.seq_id] = entry
            rows.append(entry.index)
            if chunk.end <= (length - 1) * block_size:  # blocks past its positions: rare
                past_use.append((len(rows) - 1, -(-chunk.end // block_size), length))
        if len(known) > len(placed) - new:  # some were not in this step
            for seq_id, entry in known.items():
                if seq_id not in placed:
                    self._pool[entry.index, : entry.length] = -1
                    self._free.append(entry.index)
        self._rows = placed
        width = out.shape[1]
        if width == self._pool.shape[1]:
            # mode="clip": the rows are valid, and numpy buffers the output of mode="raise"
            np.take(self._pool, rows, axis=0, out=out[: len(rows)], mode="clip")
        else:  # a narrower table than some sequence's (eager steps size it to their contexts)
            out[: len(rows)] = self._pool[rows, :width]
        for row, used, length in past_use:
            out[row, used:length] = -1

    def _place(self, entry: _Row | None, chunk: ScheduledChunk) -> _Row:
        """``entry`` (None: a new sequence, given a free row) updated to ``chunk``'s table:
        rebuilt when its epoch changed or it is shorter, else its new blocks appended."""
        if entry is None:
            entry = _Row(self._free_row(), chunk.table_epoch)
        if entry.epoch != chunk.table_epoch or len(chunk.block_table) < entry.length:
            entry.epoch = chunk.table_epoch
            self._write(entry, chunk.block_table, 0)
        else:
            self._write(entry, chunk.block_table, entry.length)
        return entry

    def _write(self, entry: _Row, blocks: list[int], keep: int) -> None:
        """Make ``entry``'s row ``blocks``, whose first ``keep`` entries it holds already."""
        end = len(blocks)
        if end > self._pool.shape[1]:
            self._resize(self._pool.shape[0], end)
        row = self._pool[entry.index]
        row[keep:end] = blocks[keep:]
        row[end : entry.length] = -1
        entry.length = end

    def _free_row(self) -> int:
        if not self._free:
            rows = self._pool.shape[0]
            self._resize(max(16, 2 * rows), self._pool.shape[1])
            self._free.extend(range(self._pool.shape[0] - 1, rows - 1, -1))
        return self._free.pop()

    def _resize(self, rows: int, width: int) -> None:
        grown = np.full((rows, width), -1, dtype=np.int32)
        old_rows, old_width = self._pool.shape
        grown[:old_rows, :old_width] = self._pool
        self._pool = grown
