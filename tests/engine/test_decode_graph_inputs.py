"""The decode graphs' inputs are regions of one byte buffer (one host-to-device copy a step):
the regions must not overlap, must start aligned, and a bucket's prefix must hold its rows'
tables and every per-row input. The replay itself runs on the GPU (test_engine_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from hwrun.engine.cuda_graphs import _InputLayout


@pytest.mark.parametrize(("rows", "width"), [(1, 1), (3, 5), (64, 513), (512, 2561)])
def test_regions_are_disjoint_aligned_views(rows: int, width: int):
    layout = _InputLayout(rows, width)
    buffer = torch.zeros(layout.nbytes, dtype=torch.uint8)
    rows64, rows32, tables = layout.views(buffer)
    assert rows64.shape == (2, rows) and rows64.dtype == torch.int64
    assert rows32.shape == (2, rows) and rows32.dtype == torch.int32
    assert tables.shape == (rows, width) and tables.dtype == torch.int32
    base = buffer.data_ptr()
    for view in (rows64, rows32, tables):
        assert (view.data_ptr() - base) % _InputLayout.ALIGN == 0
        assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    # Fresh values in each region land in its bytes only: no region overwrites another.
    gen = torch.Generator().manual_seed(rows * 7919 + width)
    want64 = torch.randint(-(2**62), 2**62, (2, rows), generator=gen)
    want32 = torch.randint(-(2**31), 2**31 - 1, (2, rows), generator=gen, dtype=torch.int32)
    tables_want = torch.randint(-1, 1 << 20, (rows, width), generator=gen, dtype=torch.int32)
    rows64.copy_(want64)
    rows32.copy_(want32)
    tables.copy_(tables_want)
    assert torch.equal(rows64, want64) and torch.equal(rows32, want32)
    assert torch.equal(tables, tables_want)
    # A bucket of b rows copies the prefix up to its tables' end: every row input is inside.
    assert layout.prefix_bytes(rows) == layout.nbytes
    for bucket in {1, rows}:
        prefix = layout.prefix_bytes(bucket)
        copy = torch.zeros_like(buffer)
        copy[:prefix] = buffer[:prefix]
        got64, got32, got_tables = layout.views(copy)
        assert torch.equal(got64, want64) and torch.equal(got32, want32)
        assert torch.equal(got_tables[:bucket], tables_want[:bucket])
        assert not got_tables[bucket:].any()
