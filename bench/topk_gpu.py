"""GPU benchmark of ``indexer.topk``: the threshold kernel against torch.topk and the radix kernel.

Usage: ``python bench/topk_gpu.py [--shapes 64x131072,...] [--kinds normal,indexer] [--sweep]
[--budget-s S] [--out DIR]``. Run from the repository root with ``PYTHONPATH=core:plugins/nvidia``.

Top-2048 at 1, 8 and 64 rows of 32768 and 131072 columns (decode: each row its whole width) and
4096 x 16384 (a prefill chunk: row i sees the first 12289 + i columns). Inputs: ``normal``
(torch.randn), ``relu`` (ReLU'd randn, half exact zeros, gpu_ops.py's input) and ``indexer``
(the reference indexer's scores sum_h w_h relu(q_h . k) of random fp8 queries and keys, 64
heads, signed weights). Times are medians of CUDA-graph replays; torch.topk (sorted, over the
whole rows: it takes no windows) and the radix kernel are the peers. Each row's note gives the
candidate counts per row (median / max) and how many rows overflowed the buffer to the slow path.

``--kernel-split`` adds each kernel's exposed device time per call to the row's note.
``--sweep`` times, at the ``--sweep-shapes`` on indexer-like rows, every entry of
topk_threshold.SWEEP_GRID (one parameter changed at a time) and compaction chunks of 2, 4, 16
and 32 programs per SM, and reports the best next to the default.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent.parent))  # tests.kernels

from gpu_bench_common import (
    Row,
    bench,
    kernel_split,
    markdown,
    split_note,
    start_run,
    write_results,
)

from hwrun.kernels.triton import topk as radix
from hwrun.kernels.triton import topk_threshold as threshold
from tests.kernels.gpu_inputs import indexer_like_logits

K = 2048
SHAPES = "1x32768,8x32768,64x32768,1x131072,8x131072,64x131072,4096x16384"


def make_inputs(kind: str, rows: int, length: int):
    """Scores and windows: decode rows see every column, 4096-row shapes a causal chunk."""
    if kind == "indexer":
        logits = indexer_like_logits(rows, length)
    else:
        logits = torch.randn(rows, length, device="cuda")
        if kind == "relu":
            logits.relu_()
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    if rows >= 4096:
        ends = torch.arange(length - rows + 1, length + 1, dtype=torch.int32, device="cuda")
    else:
        ends = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    return logits, starts, ends


def counts_note(logits, starts, ends, tiles) -> str:
    counts = threshold.candidate_counts(logits, starts, ends, K, tiles).float()
    slow = int((counts > tiles.capacity).sum())
    return (
        f"candidates/row median {counts.median().item():.0f} max {counts.max().item():.0f}, "
        f"{slow} rows on the slow path"
    )


def sweep(logits, starts, ends, default_us: float, log: list[str], label: str) -> str:
    """SWEEP_GRID and chunk counts at this shape; the best against the default, as a note."""
    rows = logits.shape[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = list(threshold.SWEEP_GRID)
    grid += [
        replace(threshold.ThresholdTiles(), chunks=-(-c * sms // rows)) for c in (2, 4, 16, 32)
    ]
    best, best_us = None, default_us
    for tiles in grid:
        try:
            us = bench(lambda tiles=tiles: threshold.topk(logits, starts, ends, K, tiles), rep=40)
        except Exception as exc:  # a configuration the compiler refuses
            log.append(f"{label} {tiles}: failed {type(exc).__name__}: {str(exc)[:120]}")
            continue
        log.append(f"{label} {tiles}: {us:.1f} us; {counts_note(logits, starts, ends, tiles)}")
        print(log[-1], flush=True)
        if us < best_us:
            best, best_us = tiles, us
    return f"best {best}: {best_us:.1f} us" if best else "default is the best"


def shape_row(ceil, shape: str, kind: str, args, log: list[str], deadline: float) -> Row:
    rows, length = (int(n) for n in shape.split("x"))
    logits, starts, ends = make_inputs(kind, rows, length)
    us = bench(lambda: threshold.topk(logits, starts, ends, K))
    peers = {
        "torch.topk": bench(lambda: torch.topk(logits, K, dim=1)),
        "radix": bench(lambda: radix.topk(logits, starts, ends, K)),
    }
    note = counts_note(logits, starts, ends, threshold.ThresholdTiles())
    if args.kernel_split:
        note += "; " + split_note(*kernel_split(lambda: threshold.topk(logits, starts, ends, K)))
    if args.sweep and shape in args.sweep_shapes and time.monotonic() < deadline:
        note += "; " + sweep(logits, starts, ends, us, log, f"{shape} {kind}")
    window = "causal chunk" if rows >= 4096 else "whole rows"
    floor = ceil.floor_us(rows * length * 4 + rows * K * 4)
    return Row("indexer.topk", f"{shape} k={K} {kind}, {window}", "triton", us, floor, peers, note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma list of ROWSxCOLUMNS")
    parser.add_argument("--kinds", default="normal,indexer", help="of normal, relu, indexer")
    parser.add_argument("--sweep", action="store_true", help="time SWEEP_GRID and chunk counts")
    parser.add_argument(
        "--kernel-split", action="store_true", help="device time per kernel (torch profiler)"
    )
    parser.add_argument("--sweep-shapes", default="64x131072,1x131072,4096x16384")
    parser.add_argument("--budget-s", type=float, default=900.0, help="stop sweeping after")
    parser.add_argument("--out", default=None, help="directory for topk.md / .json / .log")
    args = parser.parse_args()
    args.sweep_shapes = set(args.sweep_shapes.split(","))
    deadline = time.monotonic() + args.budget_s
    ceil, head = start_run()
    log: list[str] = []
    table = []
    for shape in args.shapes.split(","):
        for kind in args.kinds.split(","):
            table.append(shape_row(ceil, shape, kind, args, log, deadline))
            print(markdown(table[-1:]), flush=True)
            torch.cuda.empty_cache()
    write_results(args.out, "topk", "topk_gpu", head, table, log)


if __name__ == "__main__":
    main()
