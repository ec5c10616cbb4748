"""One fp8 and one mxfp4 indexer.logits_paged launch at B=64, ctx 131072, for a profiler.

``ncu --clock-control none -k regex:paged_logits python bench/profile_logits_paged.py``
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import index_cache

from hwrun.kernels.triton.indexer_logits import logits_paged

batch, ctx, heads = 64, 131072, 64
q = torch.randn(batch, 1, heads, 128, device="cuda").to(torch.float8_e4m3fn)
w = torch.rand(batch, heads, device="cuda")
lens = torch.full((batch, 1), ctx, dtype=torch.int32, device="cuda")
for fmt in ("fp8", "mxfp4"):
    cache, table = index_cache(fmt, batch, ctx)
    for _ in range(2):
        logits_paged(q, w, cache, fmt, table, lens, ctx)
    torch.cuda.synchronize()
