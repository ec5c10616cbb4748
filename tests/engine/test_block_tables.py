"""The runner's kept block tables equal the scheduler's lists, through growth and frees."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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


@st.composite
def _steps(draw):
    """Steps of up to 8 sequences: each step some grow by a few positions, get freed (a new
    epoch) or allocate a block ahead of their positions; a random subset in a random order
    decodes, into a table of random width and spare rows."""
    num_seqs = draw(st.integers(1, 8))
    block_size = draw(st.sampled_from([1, 4, 16]))
    tables = {s: [] for s in range(num_seqs)}
    lengths, epochs = dict.fromkeys(tables, 0), dict.fromkeys(tables, 0)
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        for seq in draw(st.lists(st.sampled_from(sorted(tables)), max_size=num_seqs)):
            event = draw(st.sampled_from(["grow", "grow", "grow", "free", "ahead"]))
            if event == "free":
                tables[seq], lengths[seq], epochs[seq] = [], 0, epochs[seq] + 1
            elif event == "ahead":
                tables[seq] = [*tables[seq], draw(st.integers(0, 999))]
            lengths[seq] += draw(st.integers(1, 3 * block_size))
            while len(tables[seq]) * block_size < lengths[seq]:
                tables[seq] = [*tables[seq], draw(st.integers(0, 999))]
        batch = draw(st.permutations([s for s in tables if lengths[s]]))
        batch = batch[: draw(st.integers(0, len(batch)))]
        chunks = [_chunk(s, tables[s], lengths[s], epochs[s]) for s in batch]
        used = max((-(-c.end // block_size) for c in chunks), default=0)
        width = used + draw(st.integers(0, 5))
        steps.append((chunks, width, draw(st.integers(0, 3))))
    return block_size, steps


@settings(max_examples=300, deadline=None)
@given(_steps())
def test_tables_equal_the_chunks_lists(case):
    block_size, steps = case
    tables = BlockTables()
    for chunks, width, spare in steps:
        out = np.full((len(chunks) + spare, width), 7, dtype=np.int32)
        tables.fill(chunks, block_size, out)
        np.testing.assert_array_equal(out[: len(chunks)], _expected(chunks, block_size, width))
        assert (out[len(chunks) :] == 7).all()


def test_rows_of_forgotten_sequences_are_reused():
    tables, out = BlockTables(), np.zeros((4, 8), dtype=np.int32)
    for seq in range(100):  # four at a time, each decoding once
        chunks = [_chunk(4 * seq + i, [i, seq % 7], 5) for i in range(4)]
        tables.fill(chunks, 4, out)
        assert out.tolist() == [[i, seq % 7, *[-1] * 6] for i in range(4)]
    assert tables._pool.shape[0] == 16  # the first allocation, never grown


def test_a_shorter_table_in_the_same_epoch_is_rebuilt():
    tables, out = BlockTables(), np.zeros((1, 4), dtype=np.int32)
    tables.fill([_chunk(0, [5, 6, 8], 12)], 4, out)
    tables.fill([_chunk(0, [9, 3], 8)], 4, out)
    assert out.tolist() == [[9, 3, -1, -1]]


def test_a_narrower_table_than_the_kept_ones_and_blocks_past_the_positions():
    tables = BlockTables()
    wide = np.zeros((2, 6), dtype=np.int32)
    tables.fill([_chunk(0, [1, 2, 3, 4, 5], 20), _chunk(1, [6], 2)], 4, wide)
    narrow = np.zeros((2, 2), dtype=np.int32)
    tables.fill([_chunk(1, [6, 7], 5), _chunk(0, [1, 2, 3, 4, 5], 6)], 4, narrow)
    assert narrow.tolist() == [[6, 7], [1, 2]]
