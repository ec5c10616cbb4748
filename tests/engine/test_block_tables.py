"""The runner's kept block tables equal the scheduler's lists, through growth and frees."""

import numpy as np

from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.block_tables import BlockTables


def _chunk(seq_id, blocks, end, epoch=0):
    return ScheduledChunk(seq_id, [1], end - 1, list(blocks), True, table_epoch=epoch)


def _expected(chunks, block_size, width):
    out = np.full((len(chunks), width), -1, dtype=np.int32)
    for row, chunk in enumerate(chunks):
        used = -(-chunk.end // block_size)
        out[row, :used] = chunk.block_table[:used]
    return out


def test_tables_follow_growth_frees_and_batch_changes():
    rng = np.random.default_rng(0)
    tables, block_size, width = BlockTables(), 4, 64
    live = {seq: [] for seq in range(6)}
    epochs = dict.fromkeys(live, 0)
    lengths = dict.fromkeys(live, 0)
    for _ in range(200):
        seq = int(rng.integers(6))
        if rng.random() < 0.1:  # freed (finished or preempted): a new table, a new epoch
            live[seq], lengths[seq], epochs[seq] = [], 0, epochs[seq] + 1
        lengths[seq] += 1
        while len(live[seq]) * block_size < lengths[seq]:
            live[seq].append(int(rng.integers(1000)))
        batch = [s for s in live if lengths[s] and rng.random() < 0.7]
        chunks = [_chunk(s, live[s], lengths[s], epochs[s]) for s in batch]
        out = np.zeros((len(chunks) + 2, width), dtype=np.int32) + 7
        tables.fill(chunks, block_size, out)
        np.testing.assert_array_equal(out[: len(chunks)], _expected(chunks, block_size, width))
        assert (out[len(chunks) :] == 7).all()  # rows past the batch untouched


def test_a_new_epoch_replaces_a_table_of_the_same_length():
    tables, out = BlockTables(), np.zeros((1, 4), dtype=np.int32)
    tables.fill([_chunk(0, [5, 6], 8)], 4, out)
    tables.fill([_chunk(0, [9, 3], 8, epoch=1)], 4, out)
    assert out.tolist() == [[9, 3, -1, -1]]
