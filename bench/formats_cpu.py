"""CPU throughput of the byte-exact format codecs: encode and decode of 16M elements each.

For every format it quantizes float32 Gaussian data and decodes the result, timing each step
(best of ``--repeats`` runs, torch limited to ``--threads`` intra-op threads) and printing
millions of elements per second of wall time and per second of this process's CPU time. Row
formats process whole rows: latent rows 576 elements per token, index keys 128. On a shared
machine the wall figures follow the load (printed beside the table); with ``--threads 1`` the
CPU-time figures do not, and say what one dedicated core does.

    .venv/bin/python bench/formats_cpu.py [--elements 16777216] [--threads 2] [--repeats 3]
                                          [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hwrun.formats import fp8, int4, mxfp4, nvfp4
from hwrun.formats.index_keys import INDEX_KEY_FORMATS
from hwrun.formats.latent import LATENT_DIM, LATENT_FORMATS, NOPE_DIM

WEIGHT_ROWS = 4096


@dataclass(frozen=True)
class Case:
    name: str
    row: int  # elements per row of the input
    encode: Callable[[torch.Tensor], Any]
    decode: Callable[[Any], torch.Tensor]


def _cases() -> list[Case]:
    cases = [
        Case("e4m3 elements", 4096, fp8.encode_e4m3, fp8.decode_e4m3),
        Case(
            "fp8 groups of 128",
            4096,
            fp8.quantize_fp8_groups,
            lambda e: fp8.dequantize_fp8_groups(*e),
        ),
        Case(
            "fp8 groups of 128, ue8m0",
            4096,
            lambda x: fp8.quantize_fp8_groups(x, ue8m0=True),
            lambda e: fp8.dequantize_fp8_groups(*e),
        ),
        Case(
            "fp8 block128 weights",
            4096,
            fp8.quantize_fp8_block128,
            lambda e: fp8.dequantize_fp8_block128(*e),
        ),
        Case("mxfp4 FLOOR", 4096, mxfp4.quantize_mxfp4, lambda e: mxfp4.dequantize_mxfp4(*e)),
        Case(
            "mxfp4 RCEIL",
            4096,
            lambda x: mxfp4.quantize_mxfp4(x, "rceil"),
            lambda e: mxfp4.dequantize_mxfp4(*e),
        ),
        Case("nvfp4", 4096, nvfp4.quantize_nvfp4, lambda e: nvfp4.dequantize_nvfp4(*e)),
        Case(
            "int4 g128 weights",
            4096,
            int4.quantize_int4_g128,
            lambda e: int4.dequantize_int4_g128(*e),
        ),
    ]
    for name, f in LATENT_FORMATS.items():
        cases.append(
            Case(
                f"latent {name}",
                LATENT_DIM,
                lambda x, f=f: f.encode(x[:, :NOPE_DIM], x[:, NOPE_DIM:]),
                lambda rows, f=f: f.decode(rows),
            )
        )
    for name, f in INDEX_KEY_FORMATS.items():
        cases.append(Case(f"index keys {name}", 128, f.encode, lambda e, f=f: f.decode(*e)))
    return cases


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Best wall seconds, best process CPU seconds (all threads), and the result."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run the formats whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.elements:,} elements per "
        f"format, load average before: {os.getloadavg()[0]:.2f}"
    )
    print()
    print(
        "| format | elements | encode M/s (wall) | decode M/s (wall) | encode M/s (CPU time) "
        "| decode M/s (CPU time) |"
    )
    print("|---|---|---|---|---|---|")
    for case in (c for c in _cases() if args.only in c.name):
        rows = args.elements // case.row
        x = torch.randn(rows, case.row, generator=generator)
        enc = _best(lambda c=case, x=x: c.encode(x), args.repeats)
        dec = _best(lambda c=case, e=enc[2]: c.decode(e), args.repeats)
        n = x.numel()
        rates = " | ".join(f"{n / s / 1e6:,.1f}" for s in (enc[0], dec[0], enc[1], dec[1]))
        print(f"| {case.name} | {n:,} | {rates} |", flush=True)
    print()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
