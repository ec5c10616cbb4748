"""One indexer.logits_paged launch per key format at B=64, ctx 131072, for a profiler.

``ncu --clock-control none -k regex:paged_logits python bench/profile_logits_paged.py
[--impl triton|gluon] [--formats fp8,mxfp4] [--option registers=True ...]``: each format's
kernel runs twice (the first launch compiles it), so profile the last launch of each
(``--launch-skip 1``). ``--option`` passes a launch option to the kernel (a Python literal).
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import index_cache


def kernel(impl: str):
    if impl == "gluon":
        from hwrun_nvidia.gluon_paged_logits import logits_paged
    else:
        from hwrun.kernels.triton.indexer_logits import logits_paged
    return logits_paged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("triton", "gluon"), default="triton")
    parser.add_argument("--formats", default="fp8,mxfp4", help="comma list of index-key formats")
    parser.add_argument(
        "--option", action="append", default=[], help="NAME=VALUE launch option, repeatable"
    )
    args = parser.parse_args()
    options = {}
    for option in args.option:
        name, _, value = option.partition("=")
        options[name] = ast.literal_eval(value)
    logits_paged = kernel(args.impl)
    batch, ctx, heads = 64, 131072, 64
    q = torch.randn(batch, 1, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(batch, heads, device="cuda")
    lens = torch.full((batch, 1), ctx, dtype=torch.int32, device="cuda")
    for fmt in args.formats.split(","):
        cache, table = index_cache(fmt, batch, ctx)
        for _ in range(2):
            logits_paged(q, w, cache, fmt, table, lens, ctx, **options)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
