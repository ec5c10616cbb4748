"""Chunk results as rows of their step's logits, and the rows the sampler takes from them."""

import torch

from hwrun.engine.batch import ChunkLogits, last_position_logits

STEP = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))


def test_a_chunk_reads_its_rows_of_the_step():
    assert torch.equal(ChunkLogits(0, STEP, range(2, 5)).logits, STEP[2:5])
    assert ChunkLogits(0, None).logits is None


def test_every_row_of_the_step_in_order_is_the_step_itself():
    results = [ChunkLogits(i, STEP, range(i, i + 1)) for i in range(6)]
    assert last_position_logits(results) is STEP


def test_leading_last_rows_are_a_slice_and_others_one_gather():
    decodes_then_prefill = [ChunkLogits(i, STEP, range(i, i + 1)) for i in (0, 1, 2)] + [
        ChunkLogits(3, STEP, range(3, 6))
    ]
    rows = last_position_logits(decodes_then_prefill[:3])
    assert rows.data_ptr() == STEP.data_ptr() and torch.equal(rows, STEP[:3])
    # Not the leading rows: gathered into rows of their own (a stack's layout), not a slice
    prefill_then_decodes = [ChunkLogits(0, STEP, range(0, 3))] + [
        ChunkLogits(i, STEP, range(i + 2, i + 3)) for i in (1, 2, 3)
    ]
    rows = last_position_logits(prefill_then_decodes)
    assert rows.data_ptr() != STEP[2].data_ptr() and torch.equal(rows, STEP[2:6])
    scattered = [ChunkLogits(0, STEP, range(0, 2)), ChunkLogits(1, STEP, range(4, 6))]
    assert torch.equal(last_position_logits(scattered), STEP[[1, 5]])


def test_chunks_with_their_own_tensors_are_stacked():
    results = [
        ChunkLogits(0, STEP[:2].clone(), range(2)),
        ChunkLogits(1, STEP[4:5].clone(), range(1)),
    ]
    assert torch.equal(last_position_logits(results), STEP[[1, 4]])
