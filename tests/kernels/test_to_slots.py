"""indexer.to_slots Triton kernel against the reference (CPU interpreter): request-major and
explicit rows, -1 padding, rows shorter than k, int64 inputs, strided positions; -1 where the
reference raises (no value can be checked on the host inside a CUDA graph)."""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton.to_slots import to_slots
from hwrun.ops.topk import to_slots as reference

SEED = torch.seed() % 2**31  # fresh inputs every run


def _inputs(requests: int, n: int, k: int, block_size: int, max_blocks: int, seed: int):
    """Positions inside each request's length (-1 padding, rows shorter than k); table entries
    past each length unallocated (-1), as the engine's block tables are."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(requests * max_blocks + 5, generator=g)[: requests * max_blocks]
    table = table.view(requests, max_blocks).clone()
    lengths = torch.randint(1, max_blocks * block_size + 1, (requests,), generator=g)
    for req in range(requests):
        table[req, -(-int(lengths[req]) // block_size) :] = -1
    rows = requests * n
    row_len = lengths.repeat_interleave(n)
    positions = torch.randint(0, 1 << 30, (rows, k), generator=g) % row_len[:, None]
    positions[torch.rand(rows, k, generator=g) < 0.2] = -1
    short = torch.randint(0, k + 1, (rows,), generator=g)  # a top-k row shorter than k
    positions[torch.arange(k)[None, :] >= short[:, None]] = -1
    # Whatever the draw, one valid position and one padding entry (a one-row case could
    # otherwise come out all padding or none).
    positions[0, 0] = 0
    positions[-1, -1] = -1
    return positions.to(torch.int32), table.to(torch.int32)


def _check(positions, table, block_size, request_of_row=None) -> torch.Tensor:
    got = to_slots(positions, table, block_size, request_of_row)
    assert got.dtype == torch.int32 and got.shape == positions.shape
    assert torch.equal(got, reference(positions, table, block_size, request_of_row)), SEED
    return got


@pytest.mark.parametrize(
    ("requests", "n", "k", "block_size", "max_blocks"),
    [
        (5, 1, 64, 16, 6),  # decode rows
        (3, 3, 24, 64, 4),  # next_n = 3 rows per request, k not a power of two
        (2, 2, 2500, 64, 48),  # k over two column programs
        (1, 1, 7, 16, 1),  # one block
        (70, 1, 1030, 16, 70),  # rows over two interpreter programs, k over two columns
    ],
)
def test_matches_the_reference(requests, n, k, block_size, max_blocks):
    positions, table = _inputs(requests, n, k, block_size, max_blocks, SEED + k)
    slots = _check(positions, table, block_size)
    assert (slots == -1).any() and (slots >= 0).any()


def test_explicit_request_of_row_and_int64_inputs():
    positions, table = _inputs(4, 2, 32, 16, 5, SEED)
    g = torch.Generator().manual_seed(SEED)
    request_of_row = (torch.arange(8) // 2)[torch.randperm(8, generator=g)].to(torch.int32)
    # Row r's positions must lie in its (shuffled) request's length: take request-major ones.
    positions = positions[(request_of_row.long() * 2) + torch.arange(8) % 2]
    _check(positions, table, 16, request_of_row)
    _check(positions.long(), table.long(), 16, request_of_row.long())


def test_strided_positions_and_empty_shapes():
    positions, table = _inputs(3, 1, 40, 16, 6, SEED)
    wide = torch.full((3, 80), -1, dtype=torch.int32)
    wide[:, ::2] = positions
    _check(wide[:, ::2], table, 16)  # a column stride of 2
    assert to_slots(torch.empty(0, 8, dtype=torch.int32), table, 16).shape == (0, 8)
    assert to_slots(torch.empty(3, 0, dtype=torch.int32), table, 16).shape == (3, 0)


def test_what_the_reference_refuses_gives_minus_one():
    table = torch.tensor([[3, 1, -1], [0, 2, 5]], dtype=torch.int32)
    positions = torch.tensor([[0, -2, 8, 12], [5, 9, 11, 4]], dtype=torch.int32)
    # -2: another negative; 8: block 2 of request 0 is unallocated; 12: past the table.
    assert to_slots(positions, table, 4).tolist() == [[12, -1, -1, -1], [9, 21, 23, 8]]
    for bad in ([[-2]], [[8]], [[12]]):
        with pytest.raises(ValueError):
            reference(torch.tensor(bad, dtype=torch.int32), table[:1], 4)
    outside = torch.tensor([2, -1], dtype=torch.int32)  # requests outside the table
    assert to_slots(positions, table, 4, outside).tolist() == [[-1] * 4] * 2


def test_a_wrong_request_mapping_is_caught():
    """Negative control: the same positions through the rows' neighbouring requests differ."""
    positions, table = _inputs(4, 1, 64, 16, 6, SEED)
    shifted = ((torch.arange(4) + 1) % 4).to(torch.int32)
    assert not torch.equal(to_slots(positions, table, 16, shifted), reference(positions, table, 16))


@pytest.mark.parametrize(
    ("positions", "table", "kwargs", "message"),
    [
        ([[0]] * 3, [[0], [1]], {}, "multiple of B=2"),
        ([[0]], [[0]], {"block_size": 0}, "block_size must be a positive int"),
        ([0], [[0]], {}, r"indices must be int32 \[R, k\]"),
        ([[0]], [[0]], {"request_of_row": [0, 0]}, r"request_of_row must be .* shape \[1\]"),
    ],
)
def test_refusals_name_the_problem(positions, table, kwargs, message):
    kwargs = {"block_size": 4, **kwargs}
    if "request_of_row" in kwargs:
        kwargs["request_of_row"] = torch.tensor(kwargs["request_of_row"], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        to_slots(
            torch.tensor(positions, dtype=torch.int32),
            torch.tensor(table, dtype=torch.int32),
            **kwargs,
        )
