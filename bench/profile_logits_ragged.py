"""One indexer.logits_ragged launch of fp8 keys at bench/gpu_ops.py's shape, for a profiler.

``ncu --clock-control none -k regex:'ragged|mqa' python bench/profile_logits_ragged.py
[--impl triton|deepgemm] [key=value ...]``: M=4096 queries of a causal prefill chunk against
N=16384 keys, H=64; each launch runs twice (the first compiles it), so profile the last
(``--launch-skip 1``). ``key=value`` pairs go to the Triton kernel as launch options
(``num_warps=8 tiles=32``).
"""

from __future__ import annotations

import argparse

import torch

from hwrun.formats.index_keys import get_index_key_format


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("triton", "deepgemm"), default="triton")
    parser.add_argument("options", nargs="*", help="Triton launch options as key=value")
    args = parser.parse_args()
    options = {key: int(value) for key, value in (o.split("=", 1) for o in args.options)}
    m, n, heads = 4096, 16384, 64
    q = torch.randn(m, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(m, heads, device="cuda")
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = torch.arange(n - m + 1, n + 1, dtype=torch.int32, device="cuda")
    elements, scales = get_index_key_format("fp8").encode(torch.randn(n, 128, device="cuda"))
    if args.impl == "deepgemm":
        import deep_gemm

        keys = (elements.view(torch.float8_e4m3fn), scales.view(torch.float32).reshape(n))
        run = lambda: deep_gemm.fp8_mqa_logits(q, keys, w, ks, ke)  # noqa: E731
    else:
        from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged

        run = lambda: logits_ragged(q, w, elements, scales, "fp8", ks, ke, **options)  # noqa: E731
    for _ in range(2):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
