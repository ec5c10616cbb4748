"""The model runner's replay path on the host: its checked inputs and per-chunk results.

Decode graphs need CUDA; a stand-in with DecodeGraphs' interface to the runner (the host block
tables, ``run``) records what the runner hands it, so the host side of a replayed step is
checked here: the one-pass checks of ``_decode_inputs`` against ``check`` chunk by chunk, and
results that name their rows of the step's logits."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.engine.batch import ScheduledChunk, last_position_logits
from hwrun.engine.context_parallel import ContextShard
from hwrun.engine.model_runner import KVPool, ModelRunner

BLOCK_SIZE, NUM_BLOCKS, VOCAB, MAX_MODEL_LEN = 4, 32, 50, 96


class RecordingGraphs:
    """DecodeGraphs' interface to the runner: the block tables' host buffer and a replay that
    records its inputs and returns fixed logits."""

    def __init__(self, batch: int = 8):
        self.tables = np.full((batch, MAX_MODEL_LEN // BLOCK_SIZE), 7, dtype=np.int32)
        self.logits = torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(0))
        self.runs = []

    def fits(self, batch: int) -> bool:
        return batch <= self.tables.shape[0]

    def host_tables(self, batch: int) -> np.ndarray:
        return self.tables[:batch]

    def run(self, input_ids, positions, slots) -> torch.Tensor:
        self.runs.append((input_ids, positions, slots))
        return self.logits[: len(positions)]


def _runner(graphs=None) -> ModelRunner:
    pool = KVPool(SimpleNamespace(block_size=BLOCK_SIZE), NUM_BLOCKS, torch.empty(0))
    return ModelRunner(
        SimpleNamespace(context=ContextShard()),
        pool,
        SimpleNamespace(vocab_size=VOCAB, eos_token_ids=()),
        None,
        "test",
        MAX_MODEL_LEN,
        graphs,
        "recording",
    )


def test_a_replayed_step_hands_the_graphs_its_inputs_and_names_rows_of_its_logits():
    graphs = RecordingGraphs()
    runner = _runner(graphs)
    chunks = [
        ScheduledChunk(0, [5], 9, [3, 8, 1], True),
        ScheduledChunk(1, [7], 4, [2, 6], True),
        ScheduledChunk(2, [0], 1, [4], True),
    ]
    results = runner.execute(chunks)
    assert graphs.runs == [([5, 7, 0], [9, 4, 1], [1 * 4 + 1, 6 * 4 + 0, 4 * 4 + 1])]
    assert graphs.tables[:3].tolist() == [
        [3, 8, 1] + [-1] * 21,
        [2, 6] + [-1] * 22,
        [4] + [-1] * 23,
    ]
    assert [r.seq_id for r in results] == [0, 1, 2]
    for row, result in enumerate(results):
        assert torch.equal(result.logits, graphs.logits[row : row + 1])
    assert last_position_logits(results).data_ptr() == graphs.logits.data_ptr()
    ids = torch.tensor([1, 2, 3])
    runner.execute(chunks, input_ids=ids)
    assert graphs.runs[-1][0] is ids


def test_a_step_with_a_bad_chunk_is_refused_before_anything_runs():
    graphs = RecordingGraphs()
    runner = _runner(graphs)
    chunks = [
        ScheduledChunk(0, [5], 9, [3, 8, 1], True),
        ScheduledChunk(1, [VOCAB], 4, [2, 6], True),
    ]
    with pytest.raises(ValueError, match=r"sequence 1: token ids \[50\] outside the vocabulary"):
        runner.execute(chunks)
    assert graphs.runs == [] and (graphs.tables == 7).all()


@st.composite
def _decode_chunk(draw, seq_id: int) -> ScheduledChunk:
    edges = st.sampled_from([MAX_MODEL_LEN - 1, MAX_MODEL_LEN])  # the last position, one past
    start = draw(st.one_of(st.integers(1, MAX_MODEL_LEN + 2), edges))
    needed = start // BLOCK_SIZE + 1
    length = draw(st.sampled_from([needed, needed, needed + 1, needed - 1]))
    blocks = draw(st.lists(st.integers(-1, NUM_BLOCKS), min_size=length, max_size=length))
    token = draw(st.sampled_from([0, 3, VOCAB - 1, VOCAB, -1]))
    return ScheduledChunk(seq_id, [token], start, blocks, True)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(*(_decode_chunk(i) for i in range(n)))))
def test_decode_inputs_check_as_check_does_chunk_by_chunk(chunks):
    runner = _runner()
    chunks = list(chunks)
    first_error = None
    for chunk in chunks:
        try:
            runner.check(chunk)
        except ValueError as error:
            first_error = str(error)
            break
    if first_error is not None:
        with pytest.raises(ValueError) as raised:
            runner._decode_inputs(chunks)
        assert str(raised.value) == first_error
        return
    assert runner._decode_inputs(chunks) == (
        [c.token_ids[0] for c in chunks],
        [c.start for c in chunks],
        [c.slot(c.start, BLOCK_SIZE) for c in chunks],
    )
