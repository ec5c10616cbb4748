"""One sparse_mla.decode launch over fp8_ds_mla rows at bench/gpu_ops.py's shape, for a profiler.

``ncu --clock-control none -k regex:'mla|flash' python bench/profile_sparse_mla.py
[--impl gluon|triton|flashmla] [--batch 64] [key=value ...]``: H=128 heads, top-2048 of a
262,144-token cache; each launch runs twice (the first compiles it), so profile the last
(``--launch-skip 1``). ``key=value`` pairs go to the hwrun kernel (``stages=1 splits=2``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import latent_cache

TOKENS, HEADS, TOPK, SCALE = 262144, 128, 2048, 576**-0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("gluon", "triton", "flashmla"), default="gluon")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("options", nargs="*", help="hwrun kernel options as key=value")
    args = parser.parse_args()
    options = {key: int(value) for key, value in (o.split("=", 1) for o in args.options)}
    cache = latent_cache("fp8_ds_mla", TOKENS)
    q = torch.randn(args.batch, 1, HEADS, 576, device="cuda", dtype=torch.bfloat16)
    slots = torch.randint(0, TOKENS, (args.batch, 1, TOPK), device="cuda", dtype=torch.int32)
    if args.impl == "flashmla":
        import flash_mla

        meta, _ = flash_mla.get_mla_metadata()
        paged = cache.unsqueeze(2)
        run = lambda: flash_mla.flash_mla_with_kvcache(  # noqa: E731
            q, paged, None, None, 512, meta, softmax_scale=SCALE, is_fp8_kvcache=True,
            indices=slots,
        )  # fmt: skip
    elif args.impl == "gluon":
        from hwrun_nvidia.gluon_sparse_mla import decode

        run = lambda: decode(q, cache, slots, SCALE, **options)  # noqa: E731
    else:
        from hwrun.kernels.triton.sparse_mla import decode

        run = lambda: decode(q, cache, "fp8_ds_mla", slots, SCALE, **options)  # noqa: E731
    for _ in range(2):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
