"""Kernel variants the interpreter cannot vet compile for sm_90 (the H200) without a GPU: the
top-k's, the window fill's two forms (a constexpr-chosen start), and the paged indexer logits'
grids, PTX unpack and tensor-descriptor (TMA) loads, sparse MLA decode's optional launch
variants (whole rows at 8 warps, e4m3 decoded by moving bits), and the f16 products of the
fused MoE and of dense.linear.

The CPU interpreter runs a kernel as Python, so it misses what only Triton's compiler rejects:
``search_pairs`` ran exactly in the interpreter and failed to compile on its first H200 sweep
(a constexpr redefined in each round of a static loop). Triton's own compiler, with the ptxas
its wheel carries, builds the cubins here, a kernel's variants in one child process without
TRITON_INTERPRET (which this directory's conftest sets). The H200 runs Triton 3.6, CI the CPU
wheel's version, so this catches language errors, not every difference between the two: 3.6's
code generator refuses a chained comparison (``8 <= BITS <= 32``) that 3.9's compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

import pytest

ROWS = {"starts_ptr": "*i32", "ends_ptr": "*i32"}
SELECT = ("thresh_ptr", "count_ptr", "cand_key_ptr", "cand_idx_ptr", "out_ptr")
COMPACT = ("live_ptr", "nlive_ptr", "thresh_ptr", "count_ptr", "cand_key_ptr", "cand_idx_ptr")
THRESHOLD = ("max_ptr", "thresh_ptr", "count_ptr", "live_ptr", "nlive_ptr")
SCALARS = {"row_stride": "i64", "L": "i32", "k": "i32"}
# indexer_logits' paged kernels at the engine's decode shape: 64 heads, fp8 queries and keys.
PAGED = {
    "q_ptr": "*fp8e4nv",
    "w_ptr": "*fp32",
    "cache_ptr": "*u8",
    "table_ptr": "*i32",
    "lens_ptr": "*i32",
    "out_ptr": "*fp32",
    "cache_block_stride": "i64",
    "table_stride": "i32",
    "out_stride": "i32",
    "max_ctx": "i32",
    "num_ctx_blocks": "i32",
    "key_rows": "i32",
}
SPLIT = {**PAGED, "SPLITS": "i32"}
PERSISTENT = {**PAGED, "batch": "i32"}
DECODE = {
    "H": 64,
    "NEXT_N": 1,
    "NP": 1,
    "HP": 64,
    "BLOCK_SIZE": 64,
    "ELEM_BYTES": 128,
    "FMT": 0,
    "Q_FP8": True,
    "WIDE": "bf16",
    "STEP": 1,
    "FOLD": False,
    "TMA": False,
}
# prefill logits: a program's 4 query rows of 64 heads side by side in one product, a span of
# key tiles streamed through them
RAGGED = {
    "q_ptr": "*fp8e4nv",
    "w_ptr": "*fp32",
    **dict.fromkeys(("elem_ptr", "scale_ptr"), "*u8"),
    **dict.fromkeys(("ks_ptr", "ke_ptr"), "*i32"),
    "out_ptr": "*fp32",
    **dict.fromkeys(("M", "N", "elem_stride", "scale_stride", "tiles"), "i32"),
}
RAGGED_FP8 = {
    "H": 64,
    "HP": 64,
    "BLOCK_N": 64,
    "ROWS": 4,
    "FMT": 0,
    "Q_FP8": True,
    "WIDE": "bf16",
    "FOLD": False,
}
# sparse_mla's decode kernel over fp8_ds_mla rows, the bench's shape (128 heads, top-2048)
SPARSE_MLA = {
    "q_ptr": "*bf16",
    "cache_ptr": "*u8",
    "slots_ptr": "*i32",
    "lens_ptr": "*i32",
    "sink_ptr": "*fp32",
    "part_out_ptr": "*fp32",
    "part_lse_ptr": "*fp32",
    **dict.fromkeys(("k", "H", "chunk", "block_size"), "i32"),
    "cache_block_stride": "i64",
    "cache_row_stride": "i64",
    "scale_log2": "fp32",
}
MLA_DECODE = {
    "HAS_LENS": True,
    "HAS_SINK": False,
    "ROW": 0,
    "WIDE": "bf16",
    "BLOCK_H": 128,
    "BLOCK_N": 32,
    "V_PARTS": 2,
    "BF16_POSITION": False,
}
# moe.experts' two GEMM kernels over fp8 block-128 experts with the shared group
MOE_WEIGHTS = {
    "w_ptr": "*u8",
    "s_ptr": "*fp32",
    "sw_ptr": "*u8",
    "ss_ptr": "*fp32",
    "sorted_ptr": "*i32",
    "block_expert_ptr": "*i32",
}
MOE_STRIDES = {"stride_we": "i64", "stride_wn": "i32", "stride_se": "i64", "stride_sn": "i32"}
GATE_UP = {
    "x_ptr": "*bf16",
    "xs_ptr": "*fp32",
    **MOE_WEIGHTS,
    "h_ptr": "*bf16",
    "hs_ptr": "*fp32",
    "part_ptr": "*fp32",
    "count_ptr": "*i32",
    **dict.fromkeys(("D", "I", "N", "top_k", "E"), "i32"),
    **MOE_STRIDES,
}
DOWN = {
    "h_ptr": "*bf16",
    "hs_ptr": "*fp32",
    **MOE_WEIGHTS,
    "route_ptr": "*fp32",
    "out_ptr": "*fp32",
    **dict.fromkeys(("D", "I", "N", "E"), "i32"),
    **MOE_STRIDES,
}
HOST_CODES = "tensordesc<fp8e4nv[128, 128]>"
# f16 products (the decode tiles' default): x and h read as f16 with their row scales
MOE_F16 = {"FORMAT": 1, "HAS_SHARED": True, "WIDE": "fp16", "F16": True, "BLOCK_M": 16}
# a8w8: e4m3 activations against the e4m3 codes
MOE_A8W8 = {"FORMAT": 1, "HAS_SHARED": True, "WIDE": "fp8e4nv", "F16": False, "BLOCK_M": 16}
MOE_A8W8["A8"] = True
# dense.linear over e4m3 weights with f16 products: x as scaled f16
LINEAR = {
    "x_ptr": "*fp16",
    "xs_ptr": "*fp32",
    "w_ptr": "*u8",
    "s_ptr": "*fp32",
    "out_ptr": "*fp32",
    **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_xsm", "stride_xsk", "stride_wn"), "i32"),
    **dict.fromkeys(("stride_sn", "stride_om", "stride_os", "k_per_split"), "i32"),
}
LINEAR_F16 = {
    "FORMAT": 1,
    "A_FP8": False,
    "SCALED_A": True,
    "MMA": "fp16",
    "BLOCK_M": 16,
    "BLOCK_N": 64,
    "BLOCK_K": 128,
    "GROUP_M": 8,
    "SWAP_AB": False,
    "TMA": False,
}
# the top-k's one-program-per-row kernels at the decode default (8192 maxima, 128 of slack,
# 8192 slots)
THRESHOLD_ARGS = {**ROWS, **dict.fromkeys(THRESHOLD, "*i32"), "L": "i32", "k": "i32"}
THRESHOLD_DECODE = {
    "M": 8192,
    "SLACK": 128,
    "LEVELS": 5,
    "BITS": 16,
    "LIST": True,
    "PAIRS": False,
    "RADIX": False,
    "EARLY": False,
    "RADIX_BITS": 8,
}
SELECT_ARGS = {"logits_ptr": "*fp32", **ROWS, **dict.fromkeys(SELECT, "*i32"), **SCALARS}
SELECT_DECODE = {
    "CAP": 8192,
    "IDX_BITS": 17,
    "BLOCK": 1024,
    "K_BLOCK": 2048,
    "PAIRS": False,
    "RADIX": False,
    "EARLY": False,
    "RADIX_BITS": 8,
}
# the top-k's segment maxima with the threshold search folded into each row's last program
SEGMAX_ARGS = {
    "logits_ptr": "*fp32",
    **ROWS,
    "max_ptr": "*i32",
    **SCALARS,
    **dict.fromkeys((*THRESHOLD[1:], "arrived_ptr"), "*i32"),
}
SEGMAX_DECODE = {"M": 8192, "SLACK": 128, "LEVELS": 5, "BLOCK": 4096}
SEGMAX_FOLDED = {**SEGMAX_DECODE, **THRESHOLD_DECODE, "FOLD": True, "EARLY": True}
# the W_UV product that quantizes o_proj's input: the bench model's 64 heads over the latent
HEAD_QUANT_ARGS = {
    "x_ptr": "*bf16",
    "w_ptr": "*bf16",
    "values_ptr": "*bf16",
    "codes_ptr": "*u8",
    "scales_ptr": "*fp32",
    **dict.fromkeys(("T", "H"), "i32"),
    **dict.fromkeys(("stride_xt", "stride_xh", "stride_wh", "stride_wv"), "i64"),
    **dict.fromkeys(("stride_s_row", "stride_s_group"), "i64"),
}
HEAD_QUANT = {"A": 512, "V": 128, "BLOCK_T": 64, "BLOCK_A": 128, "UE8M0": False, "WIDE": "bf16"}
# kernel -> (signature, constexprs)
VARIANTS = {
    "headq_decode": (HEAD_QUANT_ARGS, HEAD_QUANT),
    "headq_one_row": (HEAD_QUANT_ARGS, {**HEAD_QUANT, "BLOCK_T": 16}),
    "headq_one_row_pdl": (HEAD_QUANT_ARGS, {**HEAD_QUANT, "BLOCK_T": 16, "PDL": True}),
    "segmax_plain": (SEGMAX_ARGS, SEGMAX_DECODE),
    "segmax_folded": (SEGMAX_ARGS, SEGMAX_FOLDED),
    "segmax_folded_pdl": (SEGMAX_ARGS, {**SEGMAX_FOLDED, "PDL": True}),
    "segmax_folded_16_warps": (SEGMAX_ARGS, SEGMAX_FOLDED),
    "threshold_one_bit": (THRESHOLD_ARGS, {**THRESHOLD_DECODE, "PAIRS": False}),
    "threshold_two_bits": (THRESHOLD_ARGS, {**THRESHOLD_DECODE, "PAIRS": True}),
    # 8 bits a round: the histograms' masks, the reversed scan and the three-way reduction
    "threshold_radix": (THRESHOLD_ARGS, {**THRESHOLD_DECODE, "RADIX": True}),
    "select_two_bits": (SELECT_ARGS, {**SELECT_DECODE, "PAIRS": True}),
    "select_radix": (SELECT_ARGS, {**SELECT_DECODE, "RADIX": True}),
    # 4 bits a round: 16-bin histograms
    "threshold_radix4": (THRESHOLD_ARGS, {**THRESHOLD_DECODE, "RADIX": True, "RADIX_BITS": 4}),
    "select_radix4": (SELECT_ARGS, {**SELECT_DECODE, "RADIX": True, "RADIX_BITS": 4}),
    # the bitwise search that stops at exactly k keys: a while loop over a reduction
    "threshold_early": (THRESHOLD_ARGS, {**THRESHOLD_DECODE, "EARLY": True}),
    "select_early": (SELECT_ARGS, {**SELECT_DECODE, "EARLY": True}),
    "compact_live": (
        {"logits_ptr": "*fp32", **ROWS, **dict.fromkeys(COMPACT, "*i32"), **SCALARS},
        {"M": 8192, "SLACK": 128, "LEVELS": 5, "CAP": 8192, "BLOCK": 1024},
    ),
    "fill_ragged": (
        {"logits_ptr": "*fp32", **ROWS, "stride_row": "i64", "width": "i32"},
        {"HAS_STARTS": True, "BLOCK": 1024},
    ),
    "fill_paged": (
        {"logits_ptr": "*fp32", **ROWS, "stride_row": "i64", "width": "i32"},
        {"HAS_STARTS": False, "BLOCK": 1024},
    ),
    # mxfp4 keys with the groups folded into one product, through the PTX unpack (the CPU
    # interpreter runs the arithmetic one): the engine's decode shape, 64 heads, fp8 queries.
    "paged_mxfp4_folded": (SPLIT, {**DECODE, "ELEM_BYTES": 64, "FMT": 1, "FOLD": True}),
    # the four group products (the mxfp4 default)
    "paged_mxfp4": (SPLIT, {**DECODE, "ELEM_BYTES": 64, "FMT": 1}),
    # fp8 pages through a tensor descriptor (TMA), on either grid; the persistent grid over
    # mxfp4 keys and over fp8 keys read through pointers.
    "paged_fp8_tma": (SPLIT, {**DECODE, "TMA": True}),
    "persistent_fp8": (PERSISTENT, {**DECODE, "BP": 64}),
    "persistent_fp8_tma": (PERSISTENT, {**DECODE, "TMA": True, "BP": 64}),
    "persistent_mxfp4_folded": (
        PERSISTENT,
        {**DECODE, "ELEM_BYTES": 64, "FMT": 1, "FOLD": True, "BP": 64},
    ),
    # sparse MLA decode: one program owns all 512 output columns of 64 heads; the e4m3 codes
    # decoded by moving bits, alone and with whole rows.
    "mla_whole_rows": (SPARSE_MLA, {**MLA_DECODE, "BLOCK_H": 64, "V_PARTS": 4}),
    "mla_bf16_position": (SPARSE_MLA, {**MLA_DECODE, "BF16_POSITION": True}),
    "mla_whole_rows_bf16_position": (
        SPARSE_MLA,
        {**MLA_DECODE, "BLOCK_H": 64, "V_PARTS": 4, "BF16_POSITION": True},
    ),
    "gateup_f16": (
        {**GATE_UP, "x_ptr": "*fp16", "h_ptr": "*fp16"},
        {**MOE_F16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLITS": 1},
    ),
    # K split in two, the tile's last split adding both (acquire-release count, .cg loads)
    "gateup_f16_split": (
        {**GATE_UP, "x_ptr": "*fp16", "h_ptr": "*fp16"},
        {**MOE_F16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLITS": 2},
    ),
    "linear_f16": (LINEAR, LINEAR_F16),
    # dense.linear_a8w8 with both e4m3 tiles through tensor descriptors, 64-row decode tiles
    "linear_a8w8_tma": (
        {**LINEAR, "x_ptr": "*u8"},
        {**LINEAR_F16, "A_FP8": True, "MMA": "fp8e4nv", "BLOCK_M": 64, "TMA": True},
    ),
    "down_f16": (
        {**DOWN, "h_ptr": "*fp16"},
        {**MOE_F16, "BLOCK_N": 64, "BLOCK_K": 64, "H_GROUP": 64},
    ),
    # the decode default since 2f8def2: 16 x 128 tiles, the gate/up split in 4 just over a wave
    "gateup_f16_wide": (
        {**GATE_UP, "x_ptr": "*fp16", "h_ptr": "*fp16"},
        {**MOE_F16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLITS": 4},
    ),
    "down_f16_wide": (
        {**DOWN, "h_ptr": "*fp16"},
        {**MOE_F16, "BLOCK_N": 128, "BLOCK_K": 128, "H_GROUP": 128},
    ),
    # the Hopper decode default since ae4bc14: the codes through one host-built descriptor
    # over every group's codes stacked (moe._stacked_codes), e4m3 [128, 128] boxes
    "gateup_f16_wide_host": (
        {**GATE_UP, "x_ptr": "*fp16", "h_ptr": "*fp16", "codes_desc": HOST_CODES},
        {**MOE_F16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLITS": 4, "TMA": True, "HOST_TMA": True},
    ),
    "down_f16_wide_host": (
        {**DOWN, "h_ptr": "*fp16", "codes_desc": HOST_CODES},
        {**MOE_F16, "BLOCK_N": 128, "BLOCK_K": 128, "H_GROUP": 128, "TMA": True, "HOST_TMA": True},
    ),
    # a8w8: e4m3 codes on both sides (x and h as uint8 codes with fp32 scales), host descriptors
    "gateup_a8w8_host": (
        {**GATE_UP, "x_ptr": "*u8", "h_ptr": "*u8", "codes_desc": HOST_CODES},
        {**MOE_A8W8, "BLOCK_N": 128, "BLOCK_K": 128, "SPLITS": 4, "TMA": True, "HOST_TMA": True},
    ),
    "gateup_a8w8_ue8m0": (
        {**GATE_UP, "x_ptr": "*u8", "h_ptr": "*u8"},
        {**MOE_A8W8, "FORMAT": 2, "UE8M0": True, "BLOCK_N": 128, "BLOCK_K": 128, "SPLITS": 1},
    ),
    "down_a8w8_host": (
        {**DOWN, "h_ptr": "*u8", "codes_desc": HOST_CODES},
        {**MOE_A8W8, "BLOCK_N": 128, "BLOCK_K": 128, "H_GROUP": 128, "TMA": True, "HOST_TMA": True},
    ),
    # Fp32Linear at decode: bf16 tiles, fp32 sums, the K runs added by the last (8 of 64 rows)
    "ragged_fp8_rows": (RAGGED, RAGGED_FP8),
    "ragged_mxfp4_rows": (RAGGED, {**RAGGED_FP8, "FMT": 1}),
    "ragged_mxfp4_folded": (RAGGED, {**RAGGED_FP8, "FMT": 1, "FOLD": True}),
    "fp32out_split": (
        {
            "x_ptr": "*bf16",
            "w_ptr": "*bf16",
            "out_ptr": "*fp32",
            "part_ptr": "*fp32",
            "count_ptr": "*i32",
            **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_wn", "stride_split"), "i32"),
            "k_run": "i32",
        },
        {"MMA": "bf16", "BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 128, "SPLITS": 8},
    ),
}
# Programmatic dependent launch (pdl.py): the grid-dependency wait and signal, and the weight
# kernels' L2 prefetch before the wait (inline PTX the interpreter never sees).
# The engine's RMSNorm with its output quantized (norm_quant.py): the hidden width after the
# residual add (32 groups, 8 warps), q-LoRA's alone (12 groups in a 16-group tile)
NORM = {
    **dict.fromkeys(("h_ptr", "delta_ptr", "h_out_ptr", "w_ptr", "y_ptr"), "*bf16"),
    "codes_ptr": "*u8",
    "scales_ptr": "*fp32",
    **dict.fromkeys(("C", "stride_h", "stride_d", "stride_s_row", "stride_s_group"), "i32"),
    "eps": "fp32",
}
VARIANTS["norm_hidden_add"] = (NORM, {"HAS_DELTA": True, "UE8M0": False, "GROUPS": 32})
VARIANTS["norm_qlora"] = (NORM, {"HAS_DELTA": False, "UE8M0": True, "GROUPS": 16})

PDL_VARIANTS = {
    "linear_a8w8_tma_pdl": ("linear_a8w8_tma", {"PDL": True, "PREFETCH_LINES": 4}),
    "fp32out_split_pdl": ("fp32out_split", {"PDL": True, "PREFETCH_LINES": 8}),
    "gateup_f16_wide_pdl": ("gateup_f16_wide", {"PDL": True}),
    "gateup_f16_wide_host_pdl": ("gateup_f16_wide_host", {"PDL": True}),
    "gateup_a8w8_host_pdl": ("gateup_a8w8_host", {"PDL": True}),
    "select_early_pdl": ("select_early", {"PDL": True}),
    "norm_hidden_add_pdl": ("norm_hidden_add", {"PDL": True}),
}
for _name, (_base, _extra) in PDL_VARIANTS.items():
    VARIANTS[_name] = (VARIANTS[_base][0], {**VARIANTS[_base][1], **_extra})
# Triton's default is 4 warps; sparse MLA decode launches 8, and so do the top-k's
# one-program-per-row kernels by default (select_warps).
NUM_WARPS = {
    "segmax_folded_16_warps": 16,
    "headq_decode": 8,
    "headq_one_row": 8,
    "segmax_plain": 8,
    "segmax_folded": 8,
    "threshold_radix": 8,
    "select_radix": 8,
    "threshold_radix4": 8,
    "select_radix4": 8,
    "threshold_early": 8,
    "select_early": 8,
    "mla_whole_rows": 8,
    "mla_bf16_position": 8,
    "mla_whole_rows_bf16_position": 8,
    "norm_hidden_add": 8,
}


def _compile(variant: str) -> dict:
    """In the child: build ``variant``'s cubin for sm_90; its size in bytes and which of
    :data:`PTX_MARKERS` its PTX has."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hwrun.kernels.triton import index_key_tiles
    from hwrun.kernels.triton.fp32_out_gemm import _fp32_out_mm_kernel
    from hwrun.kernels.triton.head_quant import _head_quantize_kernel
    from hwrun.kernels.triton.indexer_logits import (
        _paged_logits_kernel,
        _persistent_paged_logits_kernel,
    )
    from hwrun.kernels.triton.indexer_logits_ragged import _ragged_logits_kernel
    from hwrun.kernels.triton.linear import _linear_kernel
    from hwrun.kernels.triton.moe_kernels import _down_kernel, _gate_up_kernel
    from hwrun.kernels.triton.norm_quant import _norm_quantize_kernel
    from hwrun.kernels.triton.sparse_mla import _sparse_mla_decode_kernel
    from hwrun.kernels.triton.topk_select import select_candidates
    from hwrun.kernels.triton.topk_threshold import _compact_live, _segment_max, _threshold
    from hwrun.kernels.triton.window_fill import _fill_outside

    kernel = {
        "segmax": _segment_max,
        "headq": _head_quantize_kernel,
        "threshold": _threshold,
        "select": select_candidates,
        "compact": _compact_live,
        "fill": _fill_outside,
        "paged": _paged_logits_kernel,
        "persistent": _persistent_paged_logits_kernel,
        "ragged": _ragged_logits_kernel,
        "mla": _sparse_mla_decode_kernel,
        "gateup": _gate_up_kernel,
        "down": _down_kernel,
        "linear": _linear_kernel,
        "fp32out": _fp32_out_mm_kernel,
        "norm": _norm_quantize_kernel,
    }
    index_key_tiles.UNPACK_PTX = triton.language.constexpr(True)  # as on a CUDA machine
    signature, constexprs = VARIANTS[variant]
    constexprs = dict(constexprs)
    wide = {
        "bf16": triton.language.bfloat16,
        "fp16": triton.language.float16,
        "fp8e4nv": triton.language.float8e4nv,
    }
    for name in ("WIDE", "MMA"):
        if constexprs.get(name) in wide:
            constexprs[name] = wide[constexprs[name]]
    fn = kernel[variant.split("_")[0]]
    for param in fn.params:  # parameters left at their defaults (PDL off, no descriptor)
        if param.name not in constexprs and param.name not in signature and param.has_default:
            constexprs[param.name] = param.default
    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    source = ASTSource(fn, signature, constexprs)
    options = {"num_warps": NUM_WARPS.get(variant.removesuffix("_pdl"), 4)}
    compiled = triton.compile(source, GPUTarget("cuda", 90, 32), options)
    ptx = compiled.asm["ptx"]
    markers = [marker for marker in PTX_MARKERS if marker in ptx]
    return {"cubin_bytes": len(compiled.asm["cubin"]), "markers": markers}


PTX_MARKERS = ("griddepcontrol.wait", "griddepcontrol.launch_dependents", "prefetch.global.L2")


def _kernel(variant: str) -> str:
    return variant.split("_")[0]


@pytest.mark.parametrize("kernel", sorted({_kernel(v) for v in VARIANTS}))
def test_compiles_for_sm90(kernel):
    """A kernel's variants, built in one child (importing torch and Triton costs more than most
    builds)."""
    pytest.importorskip("triton")
    variants = sorted(v for v in VARIANTS if _kernel(v) == kernel)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run(
        [sys.executable, __file__, *variants], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-3000:]
    built = json.loads(child.stdout.splitlines()[-1])
    failed = {variant: result["error"] for variant, result in built.items() if "error" in result}
    assert not failed, failed
    for variant in variants:
        assert built[variant]["cubin_bytes"] > 0, variant
        # Without PDL none of its instructions; with it the wait and the signal, and the
        # prefetch exactly in the kernels that prefetch weights.
        pdl = VARIANTS[variant][1].get("PDL", False)
        prefetch = VARIANTS[variant][1].get("PREFETCH_LINES", 0) > 0
        expected = {"griddepcontrol.wait", "griddepcontrol.launch_dependents"} if pdl else set()
        expected |= {"prefetch.global.L2"} if pdl and prefetch else set()
        assert set(built[variant]["markers"]) == expected, variant


def _compile_all(variants: list[str]) -> dict:
    """Every variant's build, or the end of its traceback: one failure leaves the others."""
    built = {}
    for variant in variants:
        try:
            built[variant] = _compile(variant)
        except Exception:
            built[variant] = {"error": traceback.format_exc()[-2000:]}
    return built


if __name__ == "__main__":
    print(json.dumps(_compile_all(sys.argv[1:])))
