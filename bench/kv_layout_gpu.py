"""Does the packed KV layout cost the paged indexer bandwidth? The same paged-logits call on
one layer's index-key pages held two ways: contiguous (one layer's pool, as the op benchmarks
hold it) and as a strided view of an engine-sized packed pool (every block row holds all
layers' latent and index-key pages, so one layer's pages are ``row_bytes`` apart).

    python bench/kv_layout_gpu.py [--batch 64] [--context 131072] [--layers 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_bench_common import bench, measure_ceilings

from hwrun.plugins import load_plugins

KEY_BYTES = 132  # fp8 index key: 128 codes + one fp32 scale
LATENT_BYTES = 656  # fp8_ds_mla row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=64)
    args = parser.parse_args(argv)
    plugins = load_plugins()
    registry = plugins.registry(plugins.choose_platform("nvidia"))
    ceilings = measure_ceilings()
    blocks = args.batch * args.context // 64
    page = 64 * KEY_BYTES
    row = args.layers * 64 * (KEY_BYTES + LATENT_BYTES)
    # Zeros: the timing does not depend on the key values.
    packed = torch.zeros(blocks, row, dtype=torch.uint8, device="cuda")
    contiguous = torch.zeros(blocks, page, dtype=torch.uint8, device="cuda")
    layer_offset = (args.layers // 2) * 64 * (KEY_BYTES + LATENT_BYTES)
    views = {
        "contiguous": contiguous,
        f"packed ({row} B rows)": packed[:, layer_offset : layer_offset + page],
    }
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(args.batch, -1)
    sequential = torch.arange(blocks, device="cuda", dtype=torch.int32).view(args.batch, -1)
    lens = torch.full((args.batch, 1), args.context, device="cuda", dtype=torch.int32)
    weights = torch.rand(args.batch, args.heads, device="cuda")
    floor = ceilings.floor_us(args.batch * args.context * KEY_BYTES)
    for impl in registry.impls("indexer.logits_paged"):
        q_dtype = torch.float8_e4m3fn if impl.name == "deepgemm" else torch.bfloat16
        q = torch.randn(args.batch, 1, args.heads, 128, device="cuda").to(q_dtype)
        for name, cache in views.items():
            for order, blocks_of in (("random blocks", table), ("sequential blocks", sequential)):
                try:
                    us = bench(
                        lambda cache=cache, blocks_of=blocks_of, q=q, impl=impl: impl.fn(
                            q, weights, cache, "fp8", blocks_of, lens, args.context
                        )
                    )
                except Exception as error:  # a layout an impl refuses is a row
                    print(f"{impl.name:9s} {name:28s} {order:18s} failed: {error}")
                    continue
                print(
                    f"{impl.name:9s} {name:28s} {order:18s} {us:8.1f} us "
                    f"({100 * floor / us:.0f}% of copy roofline)"
                )


if __name__ == "__main__":
    main()
