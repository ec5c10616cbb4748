"""GPU benchmark of ``fp32_out_mm`` (Triton: bf16 operands, fp32 sums and output, its K splits
added in the launch) against ``torch.mm(x, w.t(), torch.float32)`` (cuBLAS: at decode a split-K
kernel plus a second launch for the sum), at the engine's fp32 products.

Usage: ``python bench/fp32_out_gemm_gpu.py [--tokens 1,8,64] [--tune] [--budget-s S]
[--out DIR]``. Run from the repository root with ``PYTHONPATH=core:conformance:plugins/nvidia:.``.

Shapes (N, K): the bench model's router and indexer head weights [64, 4096] (64 experts, 64
index heads), DeepSeek-V3's router [256, 7168]. Times are medians of CUDA-graph replays. The
floor is the bytes of x, the weight and the output at the measured copy bandwidth; "% roof" is
that floor over the measured time.

``--tune`` times a grid of tiles per shape and row count (block_n 16/32/64, block_k 64/128,
every power-of-two split up to the K steps and 32, 4 warps and 3 stages or 2 and 2, with the
default row block), checks each result against the exact sums to fp32 rounding, and notes the
best beside the default. ``--budget-s`` seconds of tuning (each new tile compiles first) are
shared evenly by the shapes and row counts.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import Ceilings, Row, bench, markdown, start_run, write_results

from hwrun.kernels.triton.fp32_out_gemm import Fp32OutTiles, default_tiles, fp32_out_mm

SHAPES = {  # name -> (N, K)
    "bench-model router / weights_proj": (64, 4096),
    "deepseek-v3 router": (256, 7168),
}
BLOCK_N = (16, 32, 64)
BLOCK_K = (64, 128)
MAX_SPLITS = 32
WARPS_STAGES = ((4, 3), (2, 2))


def tune_grid(m: int, n: int, k: int) -> list[Fp32OutTiles]:
    """The tiles --tune times at this shape: the default row block, the rest swept (4 warps
    first: where the budget runs out, the 2-warp half is what goes untimed)."""
    block_m = default_tiles(m, n, k).block_m
    grid = []
    for warps, stages in WARPS_STAGES:
        for block_n in BLOCK_N:
            for block_k in BLOCK_K:
                split = 1
                while split <= min(-(-k // block_k), MAX_SPLITS):
                    grid.append(Fp32OutTiles(block_m, block_n, block_k, split, warps, stages))
                    split *= 2
    return grid


def within_fp32_rounding(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Each fp32 sum of the K exact products within ``2 K 2^-24 sum |x w|`` of the exact one
    (twice the round-to-nearest bound: the tensor cores may truncate)."""
    exact = x.double() @ weight.double().T
    bound = 2 * x.shape[1] * 2.0**-24 * (x.double().abs() @ weight.double().abs().T)
    return bool(((got.double() - exact).abs() <= bound).all())


def tune(x, weight, default_us: float, log: list[str], label: str, budget_s: float) -> str:
    """The tile grid at this shape for at most ``budget_s`` seconds; the best against the
    default, as a note. A tile whose result is past fp32 rounding is logged, not timed."""
    deadline = time.monotonic() + budget_s
    best, best_us = None, default_us
    for tiles in tune_grid(x.shape[0], weight.shape[0], x.shape[1]):
        if time.monotonic() > deadline:
            log.append(f"{label}: its tuning budget is spent, the rest of the grid skipped")
            break
        try:
            if not within_fp32_rounding(fp32_out_mm(x, weight, tiles), x, weight):
                log.append(f"{label} {tiles}: WRONG (past fp32 rounding of the exact sums)")
                continue
            us = bench(lambda tiles=tiles: fp32_out_mm(x, weight, tiles), rep=40)
        except Exception as exc:  # a configuration the compiler refuses
            log.append(f"{label} {tiles}: failed {type(exc).__name__}: {str(exc)[:120]}")
            continue
        log.append(f"{label} {tiles}: {us:.2f} us")
        if us < best_us:
            best, best_us = tiles, us
    if best is None:
        return "default is the best"
    return (
        f"best m{best.block_m} n{best.block_n} k{best.block_k} split{best.splits} "
        f"w{best.num_warps} s{best.num_stages}: {best_us:.2f} us"
    )


def rows_for(ceil: Ceilings, token_counts: list[int], args, log: list[str]) -> list[Row]:
    budget_each = args.budget_s / (len(SHAPES) * len(token_counts))  # every shape gets tuned
    rows = []
    for name, (n, k) in SHAPES.items():
        weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        for tokens in token_counts:
            label = f"{name} M={tokens}"
            x = torch.randn(tokens, k, device="cuda").to(torch.bfloat16)
            if not within_fp32_rounding(fp32_out_mm(x, weight), x, weight):
                log.append(f"{label}: the default tiles are WRONG (past fp32 rounding)")
            us = bench(lambda x=x, weight=weight: fp32_out_mm(x, weight))
            cublas = bench(lambda x=x, weight=weight: torch.mm(x, weight.t(), torch.float32))
            tiles = default_tiles(tokens, n, k)
            programs = -(-tokens // tiles.block_m) * -(-n // tiles.block_n) * tiles.splits
            nbytes = 2 * (n * k + tokens * k) + 4 * tokens * n
            note = (
                f"{nbytes / 1e3:.0f} KB; tiles m{tiles.block_m} n{tiles.block_n} "
                f"k{tiles.block_k} split{tiles.splits} ({programs} programs)"
            )
            if args.tune:
                note += "; " + tune(x, weight, us, log, label, budget_each)
            shape = f"M={tokens} [{n}, {k}] ({name})"
            floor = ceil.floor_us(nbytes)
            rows.append(
                Row("fp32_out_mm", shape, "triton", us, floor, {"cuBLAS torch.mm": cublas}, note)
            )
            print(markdown(rows[-1:]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,64")
    parser.add_argument("--tune", action="store_true", help="time the tile grid per shape")
    parser.add_argument(
        "--budget-s", type=float, default=360.0, help="tuning seconds, shared by the shapes"
    )
    parser.add_argument("--out", default=None, help="directory for fp32_out_gemm.md/.json/.log")
    args = parser.parse_args()
    ceil, head = start_run()
    log: list[str] = []
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = rows_for(ceil, tokens, args, log)
    write_results(args.out, "fp32_out_gemm", "fp32_out_gemm_gpu", head, rows, log)


if __name__ == "__main__":
    main()
