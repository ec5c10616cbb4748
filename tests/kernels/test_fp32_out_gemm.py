"""fp32_out_mm's Triton kernel against the fp32 product (CPU interpreter, small shapes).

Tolerance: both sides multiply the same bf16 values (each product exact in fp32) and add them
in fp32, in different orders. Any order of K additions stays within ``K * 2^-24 * sum |x w|``
of the exact sum (K * 2^-24 bounds Higham's gamma_{K-1} at these K), so the kernel and
``x.float() @ w.float().T`` differ by at most twice that: a bound on the exact inputs, not a
loose relative tolerance, and it still catches one dropped product of an average element.
"""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton.fp32_out_gemm import (
    Fp32OutTiles,
    balanced_splits,
    default_tiles,
    fp32_out_mm,
)
from hwrun.kernels.triton.split_counters import MIN_COUNTERS, zeroed_counters

# On a GPU machine test_fp32_out_gemm_gpu.py checks the compiled kernel at the models' shapes.

CPU = torch.device("cpu")


def _operands(seed: int, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    weight = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    return x, weight


def _assert_fp32_sums(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    want = x.float() @ weight.float().T
    assert got.dtype == torch.float32 and got.shape == want.shape
    magnitude = x.double().abs() @ weight.double().abs().T
    bound = 2 * x.shape[1] * 2.0**-24 * magnitude
    excess = (got.double() - want.double()).abs() - bound
    assert (excess <= 0).all(), f"off by up to {excess.max():.3g} past the fp32 rounding bound"


@pytest.mark.parametrize("m", [1, 5, 64, 70])
def test_default_tiles_match_the_fp32_product(m):
    # N = 40: a partial column tile; K = 300: a partial 128-wide K step; 70 rows: two row blocks
    x, weight = _operands(m, m, 40, 300)
    _assert_fp32_sums(fp32_out_mm(x, weight), x, weight)


@pytest.mark.parametrize(
    "tiles",
    [
        Fp32OutTiles(16, 32, 32, splits=1),  # no split: the program writes its tile itself
        Fp32OutTiles(16, 32, 32, splits=2),  # 10 K steps: runs of 5
        Fp32OutTiles(16, 32, 32, splits=3),  # runs of 4, 4 and 2 (3 does not divide 10)
        Fp32OutTiles(16, 16, 64, splits=4),  # 5 K steps of 64: runs of 2, 2, 1, the last partial
        Fp32OutTiles(32, 64, 32, splits=16),  # more splits than K steps: one step a run
    ],
    ids=["splits1", "splits2", "splits3", "splits4_uneven", "splits_past_k"],
)
@pytest.mark.parametrize("m", [5, 70])
def test_split_runs_add_up_to_the_fp32_product(tiles, m):
    x, weight = _operands(7, m, 40, 300)
    _assert_fp32_sums(fp32_out_mm(x, weight, tiles), x, weight)


def test_every_runs_sum_reaches_the_output():
    # 5 runs of one 32-wide K step, run r's weights 2^r (times the column's n + 1), x the row's
    # m + 1: every output is 32 (m + 1)(n + 1)(2^0 + ... + 2^4), exact in fp32, and a run
    # dropped, counted twice or left to another tile changes it.
    m, n, steps, step = 3, 20, 5, 32
    run_of_column = torch.arange(steps * step) // step
    weight = (2.0**run_of_column)[None, :] * torch.arange(1, n + 1.0)[:, None]
    x = torch.arange(1, m + 1.0)[:, None].expand(m, steps * step)
    tiles = Fp32OutTiles(16, 16, step, splits=steps)
    got = fp32_out_mm(x.to(torch.bfloat16), weight.to(torch.bfloat16), tiles)
    want = step * (2**steps - 1) * torch.arange(1, m + 1.0)[:, None] * torch.arange(1, n + 1.0)
    assert torch.equal(got, want)


def test_repeated_calls_give_the_same_bits_and_leave_the_counters_zeroed():
    x, weight = _operands(9, 37, 50, 256)
    tiles = Fp32OutTiles(16, 16, 32, splits=3)  # 3 x 4 tiles, each finished by its last split
    first = fp32_out_mm(x, weight, tiles)
    assert not zeroed_counters(MIN_COUNTERS, CPU).any()
    assert torch.equal(fp32_out_mm(x, weight, tiles), first)
    assert not zeroed_counters(MIN_COUNTERS, CPU).any()


def test_a_strided_x_is_read_as_its_values():
    x, weight = _operands(10, 6, 40, 300)
    rows = torch.cat([x, x], dim=1)[:, ::2]  # K not contiguous
    assert torch.equal(fp32_out_mm(rows, weight), fp32_out_mm(rows.contiguous(), weight))


def test_no_rows_or_no_columns_give_an_empty_output():
    x, weight = _operands(11, 0, 40, 300)
    out = fp32_out_mm(x, weight)
    assert out.shape == (0, 40) and out.dtype == torch.float32
    assert fp32_out_mm(*_operands(12, 3, 0, 300)).shape == (3, 0)
    assert torch.equal(fp32_out_mm(*_operands(13, 3, 8, 0)), torch.zeros(3, 8))


@pytest.mark.parametrize(
    ("x", "weight", "expected"),
    [
        (torch.zeros(2, 64), torch.zeros(8, 64, dtype=torch.bfloat16), "x must be a 2-D bfloat16"),
        (
            torch.zeros(2, 3, 64, dtype=torch.bfloat16),
            torch.zeros(8, 64, dtype=torch.bfloat16),
            "x must be a 2-D bfloat16",
        ),
        (
            torch.zeros(2, 64, dtype=torch.bfloat16),
            torch.zeros(8, 32, dtype=torch.bfloat16),
            r"x's K \(64\) must equal weight's \(32\)",
        ),
        (
            torch.zeros(2, 64, dtype=torch.bfloat16),
            torch.zeros(64, 8, dtype=torch.bfloat16).T,
            "K contiguous",
        ),
    ],
    ids=["fp32_x", "3d_x", "k_mismatch", "transposed_weight"],
)
def test_wrong_operands_are_refused_with_the_reason(x, weight, expected):
    with pytest.raises(ValueError, match=expected):
        fp32_out_mm(x, weight)


def test_wrong_tiles_are_refused_with_every_reason():
    x, weight = _operands(14, 2, 8, 64)
    with pytest.raises(ValueError, match=r"block_n must be a power of two >= 16, got 24.*splits"):
        fp32_out_mm(x, weight, Fp32OutTiles(16, 24, 32, splits=0))


@pytest.mark.parametrize(
    ("m", "n", "k", "block_m", "splits"),
    [
        (1, 64, 4096, 16, 16),  # one row: its partials are small; capped at MAX_SPLITS
        (8, 64, 4096, 16, 16),
        (64, 64, 4096, 64, 8),  # 64 rows: each partial tile as large as 4 K steps of inputs
        (64, 256, 7168, 64, 16),
        (200, 64, 4096, 64, 8),  # prefill rows tile over the grid with 64-row blocks
    ],
)
def test_default_tiles_at_the_engine_shapes(m, n, k, block_m, splits):
    tiles = default_tiles(m, n, k)
    assert (tiles.block_m, tiles.block_n, tiles.block_k, tiles.splits) == (block_m, 16, 128, splits)
    assert balanced_splits(tiles, m, 100) == 1  # one K step: nothing to split
