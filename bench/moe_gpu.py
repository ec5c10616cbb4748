"""GPU benchmark of the fused MoE (``moe.experts``, Triton) at DeepSeek-V3 expert shapes.

Usage: ``python bench/moe_gpu.py [--tokens 1,8,64,512] [--weights fp8_block128|int4_g128]
[--activation-mode bf16|a8w8] [--tune] [--out DIR] [--no-peers]``. Run from the repository root with
``PYTHONPATH=core:plugins/nvidia``.

256 experts, top 8, hidden 7168, expert width 2048, fp8 block-128 weights (or W4A16 int4
group-128 with ``--weights int4_g128``, the PPU's MoE; DeepGEMM is an fp8 peer and is skipped
then), one shared expert in the same format (as in DeepSeek-V3's checkpoint), uniform random
routing (distinct experts per token).
Times are medians of CUDA-graph replays of the whole op (align, two GEMM kernels per expert
group, combine). The floor is the bytes of the experts the batch touches (codes and scales,
routed and shared, counted on the host) at the measured copy bandwidth, or the FLOPs at the
measured bf16 matmul rate when larger. The peer is DeepGEMM's ``m_grouped_fp8_gemm_nt_masked``
for the two GEMMs alone (fp8 activations already quantized, no SiLU, no routing, no combine):
a lower bound for a DeepGEMM-based MoE, not a like-for-like op.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import Row, bench, markdown, start_run, write_results

from hwrun.kernels.triton import moe, moe_align
from hwrun.kernels.triton.activation_quant import quantize_activations
from hwrun.ops.quantized_weight import QuantizedWeight, stack_shared_group

SHAPES = {"deepseek-v3": (256, 7168, 2048), "bench-model": (64, 4096, 512)}
EXPERTS, HIDDEN, INTER = SHAPES["deepseek-v3"]  # main() may rebind them (--shape)
TOP_K = 8


def fp8_weight(lead: tuple[int, ...], rows: int, cols: int, name: str) -> QuantizedWeight:
    """Random fp8_block128 codes (magnitude up to 1.875, random sign) and scales near 0.02."""
    codes = torch.randint(0, 0x40, (*lead, rows, cols), device="cuda", dtype=torch.uint8)
    codes |= torch.randint(0, 2, codes.shape, device="cuda", dtype=torch.uint8) << 7
    tiles = (*lead, -(-rows // 128), -(-cols // 128))
    scales = torch.rand(tiles, device="cuda") * 0.02 + 0.01
    return QuantizedWeight("fp8_block128", (*lead, rows, cols), codes, scales, name=name)


def int4_weight(
    lead: tuple[int, ...], rows: int, cols: int, name: str, device: str = "cuda"
) -> QuantizedWeight:
    """Random int4_g128 nibbles (all 16 codes) and fp32 group scales near 0.02."""
    packed = torch.randint(0, 256, (*lead, rows, cols // 2), device=device, dtype=torch.uint8)
    scales = torch.rand((*lead, rows, cols // 128), device=device) * 0.02 + 0.01
    return QuantizedWeight("int4_g128", (*lead, rows, cols), packed, scales, name=name)


WEIGHT_MAKERS = {"fp8_block128": fp8_weight, "int4_g128": int4_weight}


def routing(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(tokens, EXPERTS, device="cuda", generator=g)
    ids = scores.argsort(1)[:, :TOP_K].to(torch.int32)
    return ids, torch.rand(tokens, TOP_K, device="cuda", generator=g)


def deepgemm_us(ids: torch.Tensor, w13: QuantizedWeight, w2: QuantizedWeight) -> float:
    """DeepGEMM's masked grouped fp8 GEMMs (w13 then w2) over the same per-expert counts."""
    import deep_gemm
    from deep_gemm.utils.math import per_token_cast_to_fp8

    counts = torch.bincount(ids.reshape(-1).long(), minlength=EXPERTS)
    max_m = max(64, -(-int(counts.max()) // 64) * 64)
    expected_m = max(1, ids.numel() // EXPERTS)
    masked_m = counts.to(torch.int32)

    def activations(width: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.randn(EXPERTS * max_m, width, device="cuda", dtype=torch.bfloat16)
        codes, scales = per_token_cast_to_fp8(a, use_ue8m0=False)
        return codes.view(EXPERTS, max_m, width), scales.view(EXPERTS, max_m, -1)

    a13, a2 = activations(HIDDEN), activations(INTER)
    b13 = (w13.data.view(torch.float8_e4m3fn), w13.scales)
    b2 = (w2.data.view(torch.float8_e4m3fn), w2.scales)
    d13 = torch.empty(EXPERTS, max_m, 2 * INTER, device="cuda", dtype=torch.bfloat16)
    d2 = torch.empty(EXPERTS, max_m, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        deep_gemm.m_grouped_fp8_gemm_nt_masked(a13, b13, d13, masked_m, expected_m)
        deep_gemm.m_grouped_fp8_gemm_nt_masked(a2, b2, d2, masked_m, expected_m)

    run()
    return bench(run)


PREFILL_GRID = [
    moe.TileConfig(32, 64, 128, 4, 4),
    moe.TileConfig(64, 32, 128, 4, 4),
    moe.TileConfig(64, 64, 128, 8, 3),
    moe.TileConfig(128, 64, 128, 8, 3),
    moe.TileConfig(64, 128, 64, 4, 3),
    moe.TileConfig(64, 128, 64, 4, 3, f16_products=True),
    moe.TileConfig(128, 64, 128, 8, 3, f16_products=True),
]
TUNE_GRID = [
    moe.TileConfig(16, 32, 128, 4, 4),
    moe.TileConfig(16, 64, 128, 4, 4),
    moe.TileConfig(16, 128, 128, 4, 3),
    moe.TileConfig(32, 64, 128, 4, 4),
    moe.TileConfig(64, 64, 128, 4, 3),
    # e4m3 codes into f16 products (one conversion per two codes), activation rows scaled.
    # 2026-12-03 at the bench model's experts: bf16 tiles as W @ x^T (swapped, the weight rows
    # on the warpgroup MMA's M side) were slower at every size tried (T=64: 193-421 us against
    # 156-168 for 16-row tiles), so that orientation is gone.
    moe.TileConfig(16, 32, 128, 4, 4, f16_products=True),
    moe.TileConfig(16, 64, 128, 4, 3, f16_products=True),
    moe.TileConfig(16, 64, 128, 4, 4, f16_products=True),
    moe.TileConfig(16, 64, 128, 4, 6, f16_products=True),
    moe.TileConfig(16, 64, 64, 4, 5, f16_products=True),
    moe.TileConfig(16, 128, 128, 4, 4, f16_products=True),
    moe.TileConfig(16, 128, 128, 8, 4, f16_products=True),
    moe.TileConfig(32, 64, 128, 4, 4, f16_products=True),
    moe.TileConfig(32, 128, 128, 8, 3, f16_products=True),
    # The gate/up product split over K (its grid at the bench model's T=64: ~580 working
    # programs, 1.94 waves at 3 a multiprocessor, 61% of DRAM bandwidth in ncu).
    moe.TileConfig(16, 64, 128, 4, 4, f16_products=True, gate_up_splits=2),
    moe.TileConfig(16, 64, 128, 4, 4, f16_products=True, gate_up_splits=3),
    moe.TileConfig(16, 64, 128, 4, 4, f16_products=True, gate_up_splits=4),
    moe.TileConfig(16, 64, 128, 4, 4, f16_products=True, gate_up_splits=8),
    moe.TileConfig(16, 128, 128, 4, 4, f16_products=True, gate_up_splits=2),
    moe.TileConfig(16, 128, 128, 4, 4, f16_products=True, gate_up_splits=4),
    moe.TileConfig(32, 64, 128, 4, 4, f16_products=True, gate_up_splits=2),
]


MODE = "bf16"  # moe.experts' activation mode; main() may rebind it (--activation-mode)


def default_moe_tiles(tokens: int) -> moe.TileConfig:
    """The tiles moe.experts takes by default for ``tokens`` on this GPU."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return moe.default_tiles(
        tokens * TOP_K, EXPERTS, True, tokens=tokens, inter=INTER, num_sms=sms,
        descriptors=True, a8w8=MODE == "a8w8",
    )  # fmt: skip


def breakdown(tokens, ids, w13, w2, shared) -> str:
    """Time the grouping launch and the two GEMM launches alone (the rest is the combine)."""
    tiles = default_moe_tiles(tokens)
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    route = torch.rand(tokens * TOP_K, device="cuda")
    layout = moe_align.align_by_expert(ids, EXPERTS, tiles.block_m, with_shared=True)
    slots = tokens * (TOP_K + 1)
    align_us = bench(
        lambda: moe_align.align_by_expert(ids, EXPERTS, tiles.block_m, with_shared=True)
    )
    a8w8 = MODE == "a8w8"
    # a8w8: the activations quantized once, as moe.experts does before its launches (untimed)
    xq = quantize_activations(x, w13.format == "fp8_block128_ue8m0") if a8w8 else None
    gemm_us = bench(
        lambda: moe._swiglu_grouped(
            x, w13, w2, shared, layout, route, slots, TOP_K, tiles, a8w8, xq
        )
    )
    return f"T={tokens} breakdown: align {align_us:.1f} us, GEMM launches {gemm_us:.1f} us"


def moe_rows(
    ceil, token_counts, tune: bool, peers: bool, log: list[str], deadline: float, fmt: str
):
    """Three passes, most wanted first, each stopped at ``deadline``: the default tiles at
    every token count, then DeepGEMM (fp8 weights only), then the tile grid."""
    weight = WEIGHT_MAKERS[fmt]
    w13 = weight((EXPERTS,), 2 * INTER, HIDDEN, "w13")
    w2 = weight((EXPERTS,), HIDDEN, INTER, "w2")
    shared = (weight((), 2 * INTER, HIDDEN, "sw13"), weight((), HIDDEN, INTER, "sw2"))
    # The shared expert as group E of the routed tensors, as the engine loads it (the decode
    # tiles' host descriptors need it there)
    w13, sw13 = stack_shared_group(w13, shared[0])
    w2, sw2 = stack_shared_group(w2, shared[1])
    shared = (sw13, sw2)
    peers = peers and fmt == "fp8_block128"
    per_expert = (w13.nbytes + w2.nbytes) // EXPERTS
    shared_bytes = shared[0].nbytes + shared[1].nbytes
    rows, runs = [], []
    for tokens in token_counts:
        ids, weights = routing(tokens, seed=tokens)
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        touched = int(torch.unique(ids).numel())
        nbytes = touched * per_expert + shared_bytes + 2 * x.numel() * x.element_size()
        flops = 2 * 3 * HIDDEN * INTER * (tokens * TOP_K + tokens)

        def run(tiles=None, x=x, ids=ids, weights=weights):
            return moe.experts(x, w13, w2, ids, weights, MODE, shared, tiles=tiles)

        us = bench(run)
        shape = f"T={tokens} E={EXPERTS} k={TOP_K} D={HIDDEN} I={INTER} {fmt} {MODE} +shared"
        note = f"{touched} experts touched, {nbytes / 1e9:.2f} GB"
        rows.append(Row("moe.experts", shape, "triton", us, ceil.floor_us(nbytes, flops), {}, note))
        runs.append((tokens, ids, run))
        print(markdown(rows[-1:]), flush=True)
    if peers and importlib.util.find_spec("deep_gemm") is not None:
        for row, (tokens, ids, _) in zip(rows, runs, strict=True):
            if time.monotonic() > deadline:
                break
            try:
                row.peers["DeepGEMM GEMMs"] = deepgemm_us(ids, w13, w2)
            except Exception as exc:
                log.append(f"T={tokens} DeepGEMM failed: {type(exc).__name__}: {str(exc)[:300]}")
            print(markdown([row]), flush=True)
    for row, (tokens, ids, run) in zip(rows, runs, strict=True):
        log.append(breakdown(tokens, ids, w13, w2, shared))
        print(log[-1], flush=True)
        if not tune:
            continue
        default = default_moe_tiles(tokens)
        best, best_us = default, row.us
        rows_per_expert = tokens * TOP_K / EXPERTS
        grid = [c for c in TUNE_GRID if c.block_m <= 16 or rows_per_expert >= 8]
        for cfg in PREFILL_GRID if tokens > 512 else grid:
            if time.monotonic() > deadline:
                break
            try:
                us = bench(lambda cfg=cfg, run=run: run(cfg), rep=40)
            except Exception as exc:  # a config the compiler refuses
                log.append(f"T={tokens} {cfg}: failed {type(exc).__name__}: {str(exc)[:100]}")
                continue
            log.append(f"T={tokens} {cfg}: {us:.1f} us")
            if us < best_us:
                best, best_us = cfg, us
        if best != default:
            row.note += f"; best tiles {best}: {best_us:.1f} us"
        if time.monotonic() > deadline:
            break
        print(f"T={tokens} best {best}: {best_us:.1f} us", flush=True)
    return rows


def prefill_row(ceil) -> Row:
    """sparse_mla.prefill at a prefill chunk: 1024 tokens, 128 heads, top-2048, bf16 workspace."""
    from hwrun.kernels.triton.sparse_mla import prefill

    tokens, heads, k, workspace = 1024, 128, 2048, 16384
    q = torch.randn(tokens, heads, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(workspace, 576, device="cuda", dtype=torch.bfloat16)
    indices = torch.randint(0, workspace, (tokens, k), device="cuda", dtype=torch.int32)
    flops = 2 * tokens * heads * k * (576 + 512)
    us = bench(lambda: prefill(q, kv, indices, 0.07))
    peers = {}
    if importlib.util.find_spec("flash_mla") is not None:
        try:
            from hwrun_nvidia.flashmla import prefill as flashmla_prefill

            peers["FlashMLA"] = bench(lambda: flashmla_prefill(q, kv, indices, 0.07))
        except Exception as exc:
            print(f"FlashMLA prefill failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    shape = f"T={tokens} H={heads} k={k} S={workspace} bf16"
    return Row("sparse_mla.prefill", shape, "triton", us, ceil.floor_us(0, flops), peers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,64,512")
    parser.add_argument("--weights", choices=sorted(WEIGHT_MAKERS), default="fp8_block128")
    parser.add_argument("--tune", action="store_true", help="time the tile grid per token count")
    parser.add_argument("--no-peers", action="store_true", help="skip DeepGEMM")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop tuning/peers after")
    parser.add_argument("--out", default=None, help="directory for moe.md, moe.json, moe.log")
    parser.add_argument(
        "--shape",
        default="deepseek-v3",
        choices=["deepseek-v3", "bench-model"],
        help="experts x hidden x expert width: 256 x 7168 x 2048, or bench/build_bench_model.py's "
        "64 x 4096 x 512",
    )
    parser.add_argument("--no-prefill", action="store_true", help="skip the sparse MLA prefill row")
    parser.add_argument(
        "--activation-mode",
        choices=["bf16", "a8w8"],
        default="bf16",
        help="a8w8: e4m3 activations against the block-FP8 codes (DeepSeek's inference numerics)",
    )
    args = parser.parse_args()
    global EXPERTS, HIDDEN, INTER, MODE
    EXPERTS, HIDDEN, INTER = SHAPES[args.shape]
    MODE = args.activation_mode
    deadline = time.monotonic() + args.budget_s
    ceil, head = start_run()
    log: list[str] = []
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = moe_rows(ceil, tokens, args.tune, not args.no_peers, log, deadline, args.weights)
    try:
        if not args.no_prefill:
            rows.append(prefill_row(ceil))
    except Exception as exc:  # keep the MoE numbers
        print(f"prefill row failed: {type(exc).__name__}: {exc}", flush=True)
    write_results(args.out, "moe", "moe_gpu", head, rows, log)


if __name__ == "__main__":
    main()
