"""GPU benchmark of ``dense.linear`` (Triton) at the bench model's projections.

Usage: ``python bench/linear_gpu.py [--tokens 1,8,64,512] [--shapes q_a,o_proj,...] [--tune]
[--budget-s S] [--out DIR] [--no-peers]``. Run from the repository root with
``PYTHONPATH=core:plugins/nvidia``.

Shapes are bench/build_bench_model.py's (hidden 4096, 64 heads, q-LoRA 1536, 64 index heads):
``q_a`` [1536, 4096], ``q_b`` [12288, 1536], ``kv_a`` [576, 4096], ``o_proj`` [4096, 8192],
the indexer's ``wq_b`` [8192, 1536] and ``wk`` [128, 4096], and the two joined products the
engine runs in their place (``q_a+wk+kv_a`` [2240, 4096], ``q_b+wq_b`` [20480, 1536]) in
block-FP8 (random e4m3 codes, fp32 scales near 0.02), and an LM head [129280, 4096] that stays
bf16. Times are medians of CUDA-graph replays. The floor is the weight's bytes (codes and
scales, or bf16) plus the activations' in and out at the measured copy bandwidth, or the FLOPs
at the measured bf16 matmul rate when larger; "% roof" is that floor over the measured time.

Peers: torch's bf16 ``F.linear`` on the weight decoded to bf16 (what the engine ran before
block-FP8 weights stayed FP8: twice the weight bytes); where installed, DeepGEMM's
``fp8_gemm_nt`` and torch's ``_scaled_mm`` with 1x128 / 128x128 block scales. Those two
multiply fp8 activations (x quantized per token and 128 columns beforehand, not timed): another
op (a8w8), shown as the speed such kernels reach, not as like-for-like.

Block-FP8 shapes get a second row, ``dense.linear_a8w8`` (x quantized to e4m3 per token and 128
columns inside the timed call, then e4m3 x e4m3), against the two a8w8 peers, and where DeepGEMM
loads a third: the NVIDIA plugin's ``deepgemm`` impl of it (the quantizer, then ``fp8_gemm_nt``;
the Triton kernel below ``DEEPGEMM_MIN_ROWS``). The DeepGEMM peer is handed its scales in its
SM90 layout (tokens first), so it times its GEMM alone.

``--tune`` times, per shape and row count (and op), the tile grid of hwrun.kernels.triton.linear
(DECODE_GRID with split_k in 1, 2, 4, 8, 16 for up to 64 rows; PREFILL_GRID above) and reports
the best next to the default.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import Row, bench, markdown, start_run, write_results

from hwrun.kernels.triton import linear as tl_linear
from hwrun.kernels.triton.activation_quant import empty_scales
from hwrun.ops.quantized_weight import QuantizedWeight

SHAPES = {  # name -> (rows R, columns C, format)
    "q_a": (1536, 4096, "fp8_block128"),
    "q_b": (12288, 1536, "fp8_block128"),
    "kv_a": (576, 4096, "fp8_block128"),
    "o_proj": (4096, 8192, "fp8_block128"),
    "wq_b": (8192, 1536, "fp8_block128"),
    "wk": (128, 4096, "fp8_block128"),
    # the joined projections the engine runs (engine/fused_projections.py)
    "q_a+wk+kv_a": (2240, 4096, "fp8_block128"),
    "q_b+wq_b": (20480, 1536, "fp8_block128"),
    "lm_head": (129280, 4096, "bf16"),
}
SPLITS = (1, 2, 4, 8, 16)


def make_weight(rows: int, cols: int, fmt: str) -> QuantizedWeight:
    if fmt == "bf16":
        data = (torch.randn(rows, cols, device="cuda") * 0.02).to(torch.bfloat16)
        return QuantizedWeight("bf16", (rows, cols), data, name="w")
    codes = torch.randint(0, 0x40, (rows, cols), device="cuda", dtype=torch.uint8)
    codes |= torch.randint(0, 2, codes.shape, device="cuda", dtype=torch.uint8) << 7
    scales = torch.rand(-(-rows // 128), -(-cols // 128), device="cuda") * 0.02 + 0.01
    return QuantizedWeight(fmt, (rows, cols), codes, scales, name="w")


def fp8_peers(x: torch.Tensor, weight: QuantizedWeight, log: list[str], label: str) -> dict:
    """DeepGEMM's fp8_gemm_nt and torch._scaled_mm (blockwise) on pre-quantized activations."""
    peers: dict[str, float] = {}
    if weight.format == "bf16":
        return peers
    m, k = x.shape
    groups = x.float().view(m, -1, 128)
    x_scales = groups.abs().amax(-1).clamp_min(1e-4) / 448.0  # [M, K/128]
    x_codes = (groups / x_scales[..., None]).to(torch.float8_e4m3fn).view(m, k)
    # DeepGEMM's SM90 layout (tokens first, 16-byte-aligned columns): its GEMM alone is timed,
    # not the transpose it would launch for row-major scales
    dg_scales = empty_scales(m, k // 128, x.device, token_major=True).copy_(x_scales)
    w_codes = weight.data.view(torch.float8_e4m3fn)
    out = torch.empty(m, weight.shape[0], device="cuda", dtype=torch.bfloat16)
    if importlib.util.find_spec("deep_gemm") is not None:
        try:
            import deep_gemm

            def deepgemm() -> None:
                deep_gemm.fp8_gemm_nt((x_codes, dg_scales), (w_codes, weight.scales), out)

            deepgemm()
            peers["DeepGEMM a8w8"] = bench(deepgemm)
        except Exception as exc:
            log.append(f"{label}: DeepGEMM failed: {type(exc).__name__}: {str(exc)[:200]}")
    try:

        def scaled_mm() -> torch.Tensor:
            return torch._scaled_mm(
                x_codes,
                w_codes.t(),
                scale_a=x_scales,
                scale_b=weight.scales.t(),
                out_dtype=torch.bfloat16,
            )

        scaled_mm()
        peers["_scaled_mm a8w8"] = bench(scaled_mm)
    except Exception as exc:
        log.append(f"{label}: torch._scaled_mm blockwise failed: {type(exc).__name__}: {exc}")
    return peers


def deepgemm_adapter_row(x, weight, shape: str, floor: float, peers: dict) -> Row:
    """The NVIDIA plugin's DeepGEMM impl of dense.linear_a8w8 (quantizer + fp8_gemm_nt; the
    Triton kernel below its crossover), x quantized in the timed call."""
    from hwrun_nvidia.deepgemm_linear import linear_a8w8, uses_deepgemm

    us = bench(lambda: linear_a8w8(x, weight))
    where = "DeepGEMM" if uses_deepgemm(x.shape[0], weight) else "the Triton kernel"
    note = f"x quantized in the timed call; served by {where}"
    return Row("dense.linear_a8w8", shape, "deepgemm", us, floor, peers, note)


def tune(
    x: torch.Tensor,
    weight: QuantizedWeight,
    default_us: float,
    log: list[str],
    label: str,
    fn=tl_linear.linear,
    tma_only: bool = False,
) -> str:
    """The tile grid at this shape (``fn``: linear, or linear_a8w8 with 128-wide K steps); the
    best against the default, as a note."""
    m, k = x.shape
    if m <= tl_linear.DECODE_ROWS:
        k_steps = -(-k // 128)
        grid = [
            replace(tiles, split_k=split)
            for tiles in tl_linear.DECODE_GRID
            for split in SPLITS
            if split == 1 or k_steps // split >= tl_linear.MIN_SPLIT_STEPS
        ]
    else:
        grid = list(tl_linear.PREFILL_GRID)
    if fn is tl_linear.linear_a8w8:
        # a8w8 ignores f16_products: those entries would be duplicates
        grid = list(dict.fromkeys(replace(t, block_k=128, f16_products=False) for t in grid))
    else:  # tensor descriptors read e4m3 activations only
        grid = [t for t in grid if not t.tma]
    if tma_only:
        grid = [t for t in grid if t.tma]
    best, best_us = None, default_us
    for tiles in grid:
        try:
            us = bench(lambda tiles=tiles: fn(x, weight, tiles), rep=40)
        except Exception as exc:  # a configuration the compiler refuses
            log.append(f"{label} {tiles}: failed {type(exc).__name__}: {str(exc)[:120]}")
            continue
        log.append(f"{label} {tiles}: {us:.1f} us")
        if us < best_us:
            best, best_us = tiles, us
    return f"best {best}: {best_us:.1f} us" if best else "default is the best"


def rows_for(ceil, names, token_counts, args, log: list[str], deadline: float) -> list[Row]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in names:
        r, c, fmt = SHAPES[name]
        weight = make_weight(r, c, fmt)
        decoded = weight.dequantize().to(torch.bfloat16)  # the peer's weight
        for tokens in token_counts:
            label = f"{name} M={tokens}"
            x = (torch.randn(tokens, c, device="cuda") * 0.1).to(torch.bfloat16)
            us = bench(lambda x=x, weight=weight: tl_linear.linear(x, weight))
            peers = {"torch bf16": bench(lambda x=x, w=decoded: F.linear(x, w))}
            if not args.no_peers:
                peers |= fp8_peers(x, weight, log, label)
            nbytes = weight.nbytes + 2 * tokens * (r + c)
            tiles = tl_linear.default_tiles(tokens, r, c, sms)
            note = (
                f"{nbytes / 1e6:.1f} MB; tiles m{tiles.block_m} n{tiles.block_n} "
                f"k{tiles.block_k} split{tiles.split_k}"
            )
            if args.tune and not args.tune_a8w8_only and time.monotonic() < deadline:
                note += "; " + tune(x, weight, us, log, label)
            shape = f"{name} M={tokens} [{r}, {c}] {fmt}"
            floor = ceil.floor_us(nbytes, 2.0 * tokens * r * c)
            rows.append(Row("dense.linear", shape, "triton", us, floor, peers, note))
            print(markdown(rows[-1:]), flush=True)
            if fmt != "bf16":  # a8w8: the activations' quantization launch timed with it
                us = bench(lambda x=x, weight=weight: tl_linear.linear_a8w8(x, weight))
                note = "x quantized in the timed call (the peers' x is quantized beforehand)"
                if args.tune and time.monotonic() < deadline:
                    note += "; " + tune(
                        x, weight, us, log, label, tl_linear.linear_a8w8, args.tma_only
                    )
                a8w8_peers = {k: v for k, v in peers.items() if "a8w8" in k}
                rows.append(Row("dense.linear_a8w8", shape, "triton", us, floor, a8w8_peers, note))
                print(markdown(rows[-1:]), flush=True)
                if not args.no_peers and "DeepGEMM a8w8" in peers:
                    rows.append(deepgemm_adapter_row(x, weight, shape, floor, a8w8_peers))
                    print(markdown(rows[-1:]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,64,512")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--tune", action="store_true", help="time the tile grid per shape")
    parser.add_argument(
        "--tma-only", action="store_true", help="with --tune: the tensor-descriptor tiles only"
    )
    parser.add_argument(
        "--tune-a8w8-only", action="store_true", help="with --tune: sweep dense.linear_a8w8 only"
    )
    parser.add_argument("--no-peers", action="store_true", help="skip DeepGEMM and _scaled_mm")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop tuning after")
    parser.add_argument("--out", default=None, help="directory for linear.md / .json / .log")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    ceil, head = start_run()
    log: list[str] = []
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = rows_for(ceil, args.shapes.split(","), tokens, args, log, deadline)
    write_results(args.out, "linear", "linear_gpu", head, rows, log)


if __name__ == "__main__":
    main()
