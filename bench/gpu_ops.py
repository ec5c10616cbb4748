"""GPU benchmark of the Triton tier against its peers.

Usage: ``python bench/gpu_ops.py [--tune] [--out DIR] [--only SECTIONS]``.

Prints one table (markdown) of every op and shape: hwrun's time, the peers' times (torch
reference where it is affordable, DeepGEMM, FlashMLA, torch.topk), the ratios and the percent
of the measured roofline. ``--tune`` first times a small grid of launch configurations per
kernel and reports them (the defaults in the kernels come from such a run).
Run from the repository root with ``PYTHONPATH=core:plugins/nvidia``.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from gpu_bench_common import (
    Row,
    bench,
    index_cache,
    latent_cache,
    markdown,
    start_run,
    write_results,
)

from hwrun.kernels.triton import (
    indexer_logits,
    indexer_logits_ragged,
    kv_write,
    lse_combine,
    sparse_mla,
    topk_threshold,
)
from hwrun.ops import attn as ref_attn
from hwrun.ops import indexer as ref_indexer
from hwrun.ops import kv_write as ref_kv

HAS_DEEPGEMM = importlib.util.find_spec("deep_gemm") is not None
HAS_FLASHMLA = importlib.util.find_spec("flash_mla") is not None
HAS_GLUON = (
    importlib.util.find_spec("triton.experimental.gluon") is not None
    and torch.cuda.is_available()
    and torch.cuda.get_device_capability()[0] == 9
)


def _tune(name, run, configs, log):
    """Time ``run(**cfg)`` for each config; return the best config."""
    best = None
    for cfg in configs:
        try:
            us = bench(lambda cfg=cfg: run(**cfg), warmup=10, rep=40)
        except Exception as exc:  # a config the compiler refuses (shared memory, registers)
            log.append(f"{name} {cfg}: failed {type(exc).__name__}: {str(exc)[:120]}")
            print(log[-1], flush=True)
            continue
        log.append(f"{name} {cfg}: {us:.1f} us")
        print(log[-1], flush=True)  # each config as timed: a run cut short keeps what it had
        if best is None or us < best[1]:
            best = (cfg, us)
    log.append(f"{name} best {best}")
    print(log[-1], flush=True)
    return best[0] if best else {}


def indexer_rows(ceil, tune, log):
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, ctx in ((64, 131072), (1, 131072)):
        heads = 64
        q_bf16 = torch.randn(batch, 1, heads, 128, device="cuda")
        q = q_bf16.to(torch.float8_e4m3fn)
        w = torch.rand(batch, heads, device="cuda") / heads
        lens = torch.full((batch, 1), ctx, dtype=torch.int32, device="cuda")
        dg_us = None
        for fmt in ("fp8", "mxfp4"):
            cache, table = index_cache(fmt, batch, ctx)
            bpt = get_bpt(fmt)
            nbytes = batch * ctx * (bpt + 4)  # keys read + logits written

            def run(fmt=fmt, cache=cache, table=table, q=q, w=w, lens=lens, ctx=ctx, **cfg):
                return indexer_logits.logits_paged(q, w, cache, fmt, table, lens, ctx, **cfg)

            cfg = {}
            if tune:
                # 2026-12-03's sweep: stages were the lever for fp8 (4 -> 6: 437 -> 365 us),
                # tensor descriptors 6% more; the persistent grid (at these equal lengths) and
                # folded mxfp4 groups were slower everywhere (docs/benchmarks.md). Deeper
                # pipelines and wider splits now.
                # Batch 1 keeps the default split (~4 pages a program).
                splits = [None] if batch == 1 else [per_sm * sms // batch for per_sm in (8, 16)]
                stages = (4, 6, 8, 10) if fmt == "fp8" else (2, 3, 4)
                grid = [
                    {"splits": split, "num_warps": 4, "num_stages": st, "step": sp}
                    | ({"tma": tma} if fmt == "fp8" else {})
                    for split in (splits if fmt == "fp8" else splits[:1])
                    for tma in ((False, True) if fmt == "fp8" else (False,))
                    for sp in ((1,) if tma else (1, 2))
                    for st in stages
                ]
                cfg = _tune(f"logits_paged {fmt} B={batch}", run, grid, log)
            us = bench(lambda run=run, cfg=cfg: run(**cfg))
            peers = {}
            if fmt == "fp8" and HAS_DEEPGEMM:
                dg_us = deepgemm_paged_us(q, w, cache, table, lens, ctx)
            if dg_us is not None:
                peers["DeepGEMM fp8"] = dg_us
            if batch == 1:
                peers["torch ref"] = bench(
                    lambda fmt=fmt, cache=cache, table=table, q=q, w=w, lens=lens, ctx=ctx: (
                        ref_indexer.logits_paged(q, w, cache, fmt, table, lens, ctx)
                    ),
                    warmup=1,
                    rep=3,
                    graph=False,
                )
            rows.append(
                Row(
                    "indexer.logits_paged",
                    f"B={batch} ctx={ctx} H={heads} {fmt} keys, fp8 q",
                    "triton",
                    us,
                    ceil.floor_us(nbytes),
                    peers,
                    f"cfg {cfg}" if cfg else "",
                )
            )
            if HAS_GLUON:
                args = (run, fmt, cache, table, q, w, lens, ctx, batch, heads, tune)
                rows.append(gluon_paged_row(*args, ceil.floor_us(nbytes), peers, log))
            del cache, table
            torch.cuda.empty_cache()
    return rows


def gluon_paged_row(
    triton_run, fmt, cache, table, q, w, lens, ctx, batch, heads, tune, floor, peers, log
):
    """The Gluon kernel for ``fmt`` keys (hwrun_nvidia.gluon_paged_logits) on the same inputs,
    its relative error against the Triton kernel's output in the notes."""
    from hwrun_nvidia import gluon_paged_logits

    def run(**cfg):
        return gluon_paged_logits.logits_paged(q, w, cache, fmt, table, lens, ctx, **cfg)

    cfg = {}
    if tune:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        splits = [None] if batch == 1 else [None, 2 * sms // batch, 4 * sms // batch]
        stages = (3, 4, 6, 8) if fmt == "mxfp4" else (2, 3, 4, 6)
        # fp8: the overlapped form; mxfp4: ptxas capped at 128 registers (4 programs an SM),
        # two pages an iteration, the codes in registers (both even stages only), capped and not
        if fmt == "mxfp4":
            capped = {"max_registers": 128}
            forms = [{"pairs": False}, {"pairs": False, **capped}, {"pairs": True}]
            forms += [{"pairs": True, **capped}, {"registers": True}, {"registers": True, **capped}]
        else:
            forms = [{}, {"overlap": True}]

        def even_only(form, st):  # the paired and register forms take an even stage count
            return not ((form.get("pairs") or form.get("registers")) and st % 2)

        grid = [
            {"splits": sp, "stages": st, "persistent": False, **form}
            for sp in splits
            for st in stages
            for form in forms
            if even_only(form, st)
        ] + [  # the persistent grid shares the pages out itself
            {"persistent": True, "stages": st, **form}
            for st in stages
            for form in forms
            if even_only(form, st)
        ]
        cfg = _tune(f"gluon logits_paged {fmt} B={batch}", run, grid, log)
    got, want = run(**cfg), triton_run()
    finite = torch.isfinite(want)
    err = ((got[finite] - want[finite]).norm() / want[finite].norm()).item()
    same_inf = torch.equal(torch.isfinite(got), finite)
    return Row(
        "indexer.logits_paged",
        f"B={batch} ctx={ctx} H={heads} {fmt} keys, fp8 q",
        "gluon",
        bench(lambda: run(**cfg)),
        floor,
        peers,
        f"vs triton: rel err {err:.1e}, -inf positions {'equal' if same_inf else 'DIFFER'}"
        + (f"; cfg {cfg}" if cfg else ""),
    )


def get_bpt(fmt):
    return {"fp8": 132, "mxfp4": 68}[fmt]


def deepgemm_paged_us(q, w, cache, table, lens, ctx):
    import deep_gemm

    num_blocks = cache.shape[0]
    fused = cache.view(num_blocks, 64, 1, 132)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, sms)
    return bench(lambda: deep_gemm.fp8_paged_mqa_logits(q, fused, w, lens, table, meta, ctx, False))


def topk_rows(ceil, tune, log):
    rows = []
    for r, length in ((64, 131072), (1, 131072)):
        logits = torch.randn(r, length, device="cuda").relu_()  # ReLU-like: many exact zeros
        starts = torch.zeros(r, dtype=torch.int32, device="cuda")
        ends = torch.full((r,), length, dtype=torch.int32, device="cuda")

        def run(logits=logits, starts=starts, ends=ends, **cfg):
            tiles = topk_threshold.ThresholdTiles(**cfg)
            return topk_threshold.topk(logits, starts, ends, 2048, tiles)

        cfg = {}
        if tune and r > 1:  # bench/topk_gpu.py --sweep covers more shapes and chunk counts
            grid = [vars(tiles) for tiles in topk_threshold.SWEEP_GRID]
            cfg = _tune(f"topk R={r}", run, grid, log)
        us = bench(lambda cfg=cfg: run(**cfg))
        peers = {"torch.topk": bench(lambda x=logits: torch.topk(x, 2048, dim=1))}
        rows.append(
            Row(
                "indexer.topk",
                f"{r}x{length} k=2048",
                "triton",
                us,
                ceil.floor_us(r * length * 4),
                peers,
                f"cfg {cfg}" if cfg else "",
            )
        )
        if HAS_GLUON:
            rows.append(gluon_topk_row(logits, starts, ends, ceil, peers))
    return rows


def gluon_topk_row(logits, starts, ends, ceil, peers):
    """The Triton top-k with the Gluon threshold, compaction and select (the plugin's gluon
    impl, hwrun_nvidia.gluon_topk) on the same rows; the note says whether it selected the same
    set as the Triton kernels."""
    from hwrun_nvidia import gluon_topk

    kernels = topk_threshold.TopkKernels(
        gluon_topk.threshold, gluon_topk.select, gluon_topk.compact
    )
    want = topk_threshold.topk(logits, starts, ends, 2048).long().sort(1).values
    got = topk_threshold.topk(logits, starts, ends, 2048, kernels=kernels).long().sort(1).values
    us = bench(lambda: topk_threshold.topk(logits, starts, ends, 2048, kernels=kernels))
    r, length = logits.shape
    note = f"same set as the Triton kernels: {torch.equal(got, want)}"
    return Row(
        "indexer.topk",
        f"{r}x{length} k=2048",
        "gluon",
        us,
        ceil.floor_us(r * length * 4),
        peers,
        note,
    )


def sparse_mla_rows(ceil, tune, log):
    rows = []
    for batch in (64, 1):
        heads, k = 128, 2048
        tokens = max(262144, batch * k)
        q = torch.randn(batch, 1, heads, 576, device="cuda", dtype=torch.bfloat16)
        slots = torch.randint(0, tokens, (batch, 1, k), device="cuda", dtype=torch.int32)
        scale = 576**-0.5
        flops = 2 * batch * heads * k * (576 + 512)
        for fmt in ("fp8_ds_mla", "bf16"):
            cache = latent_cache(fmt, tokens)
            nbytes = batch * k * cache.shape[2] + q.numel() * 2 * 2
            floor = ceil.floor_us(nbytes, flops)

            def run(fmt=fmt, cache=cache, q=q, slots=slots, scale=scale, **cfg):
                return sparse_mla.decode(q, cache, fmt, slots, scale, **cfg)

            cfg = {}
            if tune:
                # Today's default (128 heads, half rows) against whole rows (64 heads, 8 warps),
                # each with wider tiles; fp8 rows also decoded by moving bits. One H200 run
                # (B=64 fp8, us): default 212, block_n=64 one stage 202; whole rows 286, 209
                # (block_n=64, 3 stages), 194 (block_n=128, one stage); moving bits +15-30%;
                # 32 heads 480 (4 warps) and 679 (8), left out.
                whole = {"v_parts": 4, "block_h": 64, "num_warps": 8}
                layouts = [
                    {},
                    {"block_n": 64, "num_stages": 1},
                    whole,
                    whole | {"block_n": 64, "num_stages": 3},
                    whole | {"block_n": 128, "num_stages": 1},
                ]
                dequants = (False, True) if fmt == "fp8_ds_mla" else (False,)
                splits = [{"splits": sp} for sp in (4, 8, 16)] if batch == 1 else [{}]
                grid = [
                    layout | sp | ({"bf16_position_dequant": True} if bits else {})
                    for layout in layouts
                    for bits in dequants
                    for sp in splits
                ]
                cfg = _tune(f"sparse_mla {fmt} B={batch}", run, grid, log)
            us = bench(lambda run=run, cfg=cfg: run(**cfg))
            peers = {}
            if fmt == "fp8_ds_mla" and HAS_FLASHMLA:
                peers["FlashMLA"] = flashmla_decode_us(q, cache, slots, scale)
            rows.append(
                Row(
                    "sparse_mla.decode",
                    f"B={batch} H={heads} topk={k} {fmt}",
                    "triton",
                    us,
                    floor,
                    peers,
                    f"cfg {cfg}" if cfg else "",
                )
            )
            if fmt == "fp8_ds_mla" and HAS_GLUON:
                triton_out = run(**cfg)
                args = (q, cache, slots, scale, batch, heads, k, tune, triton_out, floor)
                rows.append(gluon_mla_row(*args, peers, log))
            del cache
            torch.cuda.empty_cache()
    return rows


def gluon_mla_row(q, cache, slots, scale, batch, heads, k, tune, triton_out, floor, peers, log):
    """The Gluon kernel (hwrun_nvidia.gluon_sparse_mla) on the same inputs, its relative error
    against the Triton kernel's output in the notes."""
    from hwrun_nvidia import gluon_sparse_mla

    def run(**cfg):
        return gluon_sparse_mla.decode(q, cache, slots, scale, **cfg)

    cfg = {}
    if tune:
        splits = [None, 2, 4, 8, 16, 32] if batch == 1 else [None]
        grid = [{"stages": st, "splits": sp} for st in (2, 1) for sp in splits]
        cfg = _tune(f"gluon sparse_mla B={batch}", run, grid, log)
    out, lse = run(**cfg)
    want_out, want_lse = triton_out
    err = ((out.float() - want_out.float()).norm() / want_out.float().norm()).item()
    lse_err = (lse - want_lse).abs().max().item()
    return Row(
        "sparse_mla.decode",
        f"B={batch} H={heads} topk={k} fp8_ds_mla",
        "gluon",
        bench(lambda: run(**cfg)),
        floor,
        peers,
        f"vs triton: out rel err {err:.1e}, lse max abs err {lse_err:.1e}"
        + (f"; cfg {cfg}" if cfg else ""),
    )


def flashmla_decode_us(q, cache, slots, scale):
    import flash_mla

    meta, _ = flash_mla.get_mla_metadata()
    kv = cache.unsqueeze(2)

    def run():
        return flash_mla.flash_mla_with_kvcache(
            q, kv, None, None, 512, meta, softmax_scale=scale, is_fp8_kvcache=True, indices=slots
        )

    return bench(run)


def small_op_rows(ceil):
    rows = []
    for w_parts, shape in ((4, (64, 128)), (4, (1, 128))):
        outs = torch.randn(w_parts, *shape, 512, device="cuda", dtype=torch.bfloat16)
        lses = torch.randn(w_parts, *shape, device="cuda")
        us = bench(lambda outs=outs, lses=lses: lse_combine.lse_combine(outs, lses))
        ref = bench(lambda outs=outs, lses=lses: ref_attn.lse_combine(outs, lses), graph=False)
        nbytes = outs.numel() * 2 * (1 + 1 / w_parts)
        rows.append(
            Row(
                "attn.lse_combine",
                f"W={w_parts} {shape} D=512 bf16",
                "triton",
                us,
                ceil.floor_us(nbytes),
                {"torch ref": ref},
            )
        )
    for tokens in (64, 8192):
        for fmt, row_bytes in (("fp8_ds_mla", 656), ("bf16", 1152)):
            cache = torch.zeros(tokens * 2 // 64, 64, row_bytes, dtype=torch.uint8, device="cuda")
            nope = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
            rope = torch.randn(tokens, 64, device="cuda", dtype=torch.bfloat16)
            slots = torch.randperm(tokens * 2, device="cuda")[:tokens].to(torch.int32)
            args = (cache, nope, rope, slots, fmt)
            us = bench(lambda args=args: kv_write.write_latent(*args))
            ref = bench(lambda args=args: ref_kv.write_latent(*args), warmup=2, rep=10, graph=False)
            rows.append(
                Row(
                    "kv.write_latent",
                    f"T={tokens} {fmt}",
                    "triton",
                    us,
                    ceil.floor_us(tokens * (576 * 2 + row_bytes)),
                    {"torch ref": ref},
                )
            )
        for fmt in ("fp8", "mxfp4"):
            bpt = get_bpt(fmt)
            cache = torch.zeros(tokens * 2 // 64, 64 * bpt, dtype=torch.uint8, device="cuda")
            keys = torch.randn(tokens, 128, device="cuda", dtype=torch.bfloat16)
            slots = torch.randperm(tokens * 2, device="cuda")[:tokens].to(torch.int32)
            args = (cache, keys, slots, fmt)
            us = bench(lambda args=args: kv_write.write_index_keys(*args))
            ref = bench(
                lambda args=args: ref_kv.write_index_keys(*args), warmup=2, rep=10, graph=False
            )
            rows.append(
                Row(
                    "kv.write_index_keys",
                    f"T={tokens} {fmt}",
                    "triton",
                    us,
                    ceil.floor_us(tokens * (256 + bpt)),
                    {"torch ref": ref},
                )
            )
    return rows


def ragged_rows(ceil, tune, log):
    rows = []
    m, n, heads = 4096, 16384, 64
    q = torch.randn(m, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(m, heads, device="cuda")
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = torch.arange(n - m + 1, n + 1, dtype=torch.int32, device="cuda")  # causal prefill chunk
    from hwrun.formats.index_keys import get_index_key_format

    for fmt in ("fp8", "mxfp4"):
        elements, scales = get_index_key_format(fmt).encode(torch.randn(n, 128, device="cuda"))

        def run(e=elements, s=scales, fmt=fmt, **cfg):
            return indexer_logits_ragged.logits_ragged(q, w, e, s, fmt, ks, ke, **cfg)

        cfg = {}
        if tune:
            # Key spans of 1 tile (a program a tile, as before the loop) to 32; the forms the
            # sm_90 cubins fit without spilling: fp8 4 rows at 4 warps (244 registers) or 8
            # (155), mxfp4 1 row at 4 warps (166) or 4 rows at 8 warps and 2 stages (255).
            forms = (
                [{"num_warps": 4}, {"num_warps": 8}, {"num_warps": 8, "block_n": 128}]
                if fmt == "fp8"
                else [{"rows": 1}, {"rows": 4, "num_warps": 8, "num_stages": 2}]
            )
            grid = [form | {"tiles": tiles} for form in forms for tiles in (8, 32, 128)]
            if fmt == "fp8":  # spans past 32 tiles at 4 warps, a deeper ring, 2 rows
                grid += [{"num_warps": 4, "tiles": 64}, {"num_warps": 4, "tiles": 256}]
                grid += [{"num_warps": 4, "tiles": 32, "num_stages": 4}]
                grid += [{"num_warps": 4, "tiles": 32, "rows": 2}]
            cfg = _tune(f"logits_ragged {fmt}", run, grid, log)
        us = bench(lambda run=run, cfg=cfg: run(**cfg))
        peers = {}
        if fmt == "fp8" and HAS_DEEPGEMM:
            import deep_gemm

            keys = elements.view(torch.float8_e4m3fn)
            kscale = scales.view(torch.float32).reshape(n)
            peers["DeepGEMM"] = bench(
                lambda k=keys, s=kscale: deep_gemm.fp8_mqa_logits(q, (k, s), w, ks, ke)
            )
        flops = 2 * float((ke - ks).sum()) * heads * 128  # fp8 products for both formats
        floor = ceil.floor_us(m * n * 4, fp8_flops=flops)
        shape = f"M={m} N={n} H={heads} {fmt}"
        notes = f"cfg {cfg}" if cfg else ""
        rows.append(Row("indexer.logits_ragged", shape, "triton", us, floor, peers, notes))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", action="store_true", help="time launch-config grids first")
    parser.add_argument("--out", default=None, help="directory for bench.md, bench.json, bench.log")
    parser.add_argument("--only", default="", help="comma list: indexer,topk,mla,small,ragged")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    ceil, head = start_run()
    log: list[str] = []
    rows: list[Row] = []
    sections = (
        ("topk", topk_rows, True),
        ("indexer", indexer_rows, True),
        ("mla", sparse_mla_rows, True),
        ("small", small_op_rows, False),
        ("ragged", ragged_rows, True),
    )
    for name, fn, tunable in sections:
        if only and name not in only:
            continue
        try:
            rows += fn(ceil, args.tune, log) if tunable else fn(ceil)
        except Exception as exc:  # keep the other sections' numbers
            print(f"section {name} failed: {type(exc).__name__}: {exc}", flush=True)
        print(markdown(rows[-8:]), flush=True)
    write_results(args.out, "bench", "gpu_ops", head, rows, log)


if __name__ == "__main__":
    main()
