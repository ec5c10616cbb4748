"""The Gluon paged-logits kernel off the GPU: the adapter's switch and refusals, the launcher's
shape checks, and its sm_90 cubin built by Triton's own compiler (in a child process, as
tests/kernels/test_compiles_for_hopper.py builds the Triton kernels'), read with cuobjdump for
what the design promises: no spills, the packed keys copied 16 bytes at a time (cp.async), the
codes stored 16 bytes at a time, never byte by byte, and the product on the fp8 warpgroup MMA.
Its numerics are checked on the H200 (test_gluon_gpu.py) and its unpack by the PTX emulator
(tests/kernels/test_unpack_ptx.py).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from hwrun.knobs import KnobError
from hwrun.registry import OpRegistry, OpSpec
from hwrun_nvidia import device_checks, gluon, plugin

SPEC = OpSpec(
    op="indexer.logits_paged",
    dtype="float8_e4m3fn",
    formats=("mxfp4",),
    num_heads=64,
    head_dim=128,
    block_size=64,
    device_type="cuda",
    arch="sm_90",
)


def test_off_unless_switched_on(monkeypatch):
    monkeypatch.delenv("HWRUN_GLUON", raising=False)
    assert any("HWRUN_GLUON is off" in r for r in gluon._validate(SPEC))
    monkeypatch.setenv("HWRUN_GLUON", "maybe")
    with pytest.raises(KnobError, match="HWRUN_GLUON"):
        gluon._validate(SPEC)


def test_refusals_name_what_the_kernel_needs(monkeypatch):
    monkeypatch.setenv("HWRUN_GLUON", "1")
    switched_on = [r for r in gluon._validate(SPEC) if "CUDA device" not in r]
    assert switched_on == []  # on a machine without a GPU only the device is missing
    cases = {
        "sm_100": OpSpec(**{**SPEC.__dict__, "arch": "sm_100"}),
        "index-key format": OpSpec(**{**SPEC.__dict__, "formats": ("bf16",)}),
        "query dtype": OpSpec(**{**SPEC.__dict__, "dtype": "bfloat16"}),
        "64-token pages": OpSpec(**{**SPEC.__dict__, "block_size": 32}),
        "head_dim 128": OpSpec(**{**SPEC.__dict__, "head_dim": 64}),
    }
    for needle, spec in cases.items():
        assert any(needle in r for r in gluon._validate(spec)), needle


def test_chosen_over_triton_for_mxfp4_keys_only_when_on(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    monkeypatch.setattr("hwrun_nvidia.deepgemm.importable", lambda name: False)
    registry = OpRegistry("nvidia")
    plugin.hwrun_register_ops(registry)
    monkeypatch.setenv("HWRUN_GLUON", "1")
    assert registry.select(SPEC).impl.name == "gluon"
    fp8_keys = OpSpec(**{**SPEC.__dict__, "formats": ("fp8",)})
    assert registry.select(fp8_keys).impl.name == "gluon"  # no DeepGEMM here
    monkeypatch.setattr("hwrun_nvidia.deepgemm.importable", lambda name: True)
    with_deepgemm = OpRegistry("nvidia")
    plugin.hwrun_register_ops(with_deepgemm)
    assert with_deepgemm.select(fp8_keys).impl.name == "deepgemm"  # DeepGEMM keeps fp8 keys
    assert with_deepgemm.select(SPEC).impl.name == "gluon"  # it reads no mxfp4
    monkeypatch.setenv("HWRUN_GLUON", "0")
    assert registry.select(SPEC).impl.name == "triton"


def test_shape_reasons_send_other_calls_to_triton():
    from hwrun_nvidia import gluon_paged_logits as kernel

    q = torch.zeros(2, 1, 64, 128, dtype=torch.float8_e4m3fn)
    cache = torch.zeros(8, 64 * 68, dtype=torch.uint8)
    assert kernel.shape_reasons(q, cache, "mxfp4") == []
    assert kernel.shape_reasons(q, torch.zeros(8, 64 * 132, dtype=torch.uint8), "fp8") == []
    assert kernel.shape_reasons(q, cache, "fp8")  # an mxfp4-sized page
    assert kernel.shape_reasons(q, cache, "bf16")
    assert kernel.shape_reasons(q.to(torch.bfloat16), cache, "mxfp4")
    assert kernel.shape_reasons(torch.zeros(2, 2, 64, 128, dtype=q.dtype), cache, "mxfp4")
    assert kernel.shape_reasons(torch.zeros(2, 1, 256, 128, dtype=q.dtype), cache, "mxfp4")
    assert kernel.shape_reasons(q, torch.zeros(8, 32 * 68, dtype=torch.uint8), "mxfp4")
    wide = torch.zeros(8, 64 * 68 + 8, dtype=torch.uint8)[:, : 64 * 68]  # stride 4360
    assert any("16-byte" in r for r in kernel.shape_reasons(q, wide, "mxfp4"))


def test_default_splits_fill_one_wave():
    from hwrun_nvidia.gluon_paged_logits import default_splits

    assert default_splits(64, 2048, 132, 3) * 64 <= 3 * 132
    assert default_splits(1, 2048, 132, 3) == 3 * 132
    assert default_splits(1, 8, 132, 3) == 2  # at least 4 pages a program
    assert default_splits(1024, 2048, 132, 5) == 1


def test_the_register_form_is_taken_where_programs_have_pages_enough():
    """The default form of mxfp4 keys (H100, 2026-12-07): the register form from 16 pages a
    program (64 x 131072 on 528 programs: 248), the paired one below (1 x 131072: 3.9), never
    for fp8 keys, an odd stage count or a form asked for."""
    from hwrun_nvidia import gluon_paged_logits as kernel

    assert kernel.takes_registers("mxfp4", 4, None, 64 * 2048 / 528)
    assert kernel.takes_registers("mxfp4", 6, None, 16)
    assert not kernel.takes_registers("mxfp4", 4, None, 2048 / 528)
    assert not kernel.takes_registers("mxfp4", 4, True, 248)
    assert not kernel.takes_registers("mxfp4", 4, False, 248)  # one page an iteration asked for
    assert not kernel.takes_registers("mxfp4", 5, None, 248)
    assert not kernel.takes_registers("fp8", 4, None, 248)


def test_the_grids_refuse_splits_with_persistent():
    """An explicit split count picks the split grid; asking for both is refused before any
    launch (CPU tensors: nothing reaches a device)."""
    from hwrun_nvidia import gluon_paged_logits as kernel

    q = torch.zeros(1, 1, 64, 128).to(torch.float8_e4m3fn)
    w, lens = torch.zeros(1, 64), torch.ones(1, 1, dtype=torch.int32)
    cache, table = torch.zeros(1, 64 * 132, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="persistent=True"):
        kernel.logits_paged(q, w, cache, "fp8", table, lens, 64, splits=2, persistent=True)


def _offsets_to_elements(layout, shape) -> list[tuple[int, int]]:
    """Each shared-memory offset's (row, column) under ``layout`` (Triton's linear layout)."""
    from triton._C.libtriton import gluon_ir, ir
    from triton.experimental.gluon.language._semantic import GluonSemantic

    context = ir.context()
    ir.load_dialects(context)
    bases = GluonSemantic(gluon_ir.GluonOpBuilder(context)).to_linear_layout(layout, shape)
    bases = bases.value.offset_bases
    elements = []
    for offset in range(shape[0] * shape[1]):
        row = column = 0
        for bit, (r, c) in enumerate(bases):
            if offset >> bit & 1:
                row, column = row ^ r, column ^ c
        elements.append((row, column))
    return elements


def _layouts() -> str:
    """In the child: both layouts' offset -> element maps, as JSON (null where this Triton has
    no host-side query of a shared layout: 3.6 either lacks it or, in the H200's build, aborts
    in MLIR's verifier on a shared layout, which no try can catch)."""
    import triton
    from triton.experimental.gluon import language as gl

    if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 7):
        return json.dumps(None)
    try:
        words = _offsets_to_elements(gl.NVMMASharedLayout(128, 32, rank=2), [64, 32])
        codes = _offsets_to_elements(gl.NVMMASharedLayout(128, 8, rank=2), [64, 128])
    except (ImportError, AttributeError):
        return json.dumps(None)
    return json.dumps({"words": words, "codes": codes})


def test_int32_codes_are_read_as_fp8_in_place():
    """The mxfp4 kernel stores each page's e4m3 codes as int32 words [64, 32] and the MMA reads
    the same bytes as fp8 [64, 128]: both 128-byte-swizzled layouts must put code (r, 4c + i)
    at byte 4 * (word offset of (r, c)) + i. (In a child: Triton's bindings report leaks at the
    exit of a process that built IR on the host.)"""
    pytest.importorskip("triton.experimental.gluon")
    child = subprocess.run(
        [sys.executable, __file__, "layouts"], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr[-3000:]
    maps = json.loads(child.stdout.splitlines()[-1])
    if maps is None:
        pytest.skip("this Triton cannot query a shared layout on the host (Triton 3.6)")
    words, codes = maps["words"], maps["codes"]
    for byte, (row, column) in enumerate(codes):
        word_row, word_column = words[byte // 4]
        assert (row, column) == (word_row, 4 * word_column + byte % 4), byte


def _cubin_report(source, options: dict, name: str) -> str:
    """In the child: ``source`` compiled for sm_90 into OUT_DIR, as its shared-memory size,
    then cuobjdump's resource usage and SASS."""
    import triton
    from triton.backends.compiler import GPUTarget

    compiled = triton.compile(source, GPUTarget("cuda", 90, 32), options)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    path = os.path.join(os.environ["OUT_DIR"], f"{name}.cubin")
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True)
    sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True)
    return f"SHARED_BYTES:{compiled.metadata.shared}\n" + usage.stdout + sass.stdout


def _child_build(tmp_path, *args: str, env: dict | None = None) -> str:
    """This file run as a child with ``args`` (the builder and its arguments), outside
    Triton's interpreter, its cubin written under ``tmp_path``: the child's output."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in (env or os.environ).items() if k != "TRITON_INTERPRET"}
    env["OUT_DIR"] = str(tmp_path)
    child = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout


def _build(fmt: str, heads: int) -> str:
    """In the child: the ``fmt`` keys' kernel's sm_90 cubin for ``heads`` query heads, as
    cuobjdump's resource usage and SASS."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from hwrun_nvidia import gluon_paged_logits as kernel

    padded = max(16, triton.next_power_of_2(heads))
    signature = json.loads(os.environ["SIGNATURE"])
    # As a launch specialises them: 16-byte aligned pointers and a page stride of 16 B units.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}
    mxfp4, stages = kernel.KERNELS[fmt].mxfp4, kernel.KERNELS[fmt].stages
    overlap = os.environ.get("OVERLAP") == "1"
    pairs = os.environ.get("PAIRS") == "1"
    persistent = os.environ.get("PERSISTENT") == "1"
    registers = os.environ.get("REGISTERS") == "1"
    constexprs = {"H": heads, "HP": padded, "STAGES": stages, "MXFP4": mxfp4}
    constexprs |= {"OVERLAP": overlap, "PAIRS": pairs, "PERSISTENT": persistent}
    constexprs |= {"REGISTERS": registers}
    source = GluonASTSource(kernel._paged_logits_kernel, signature, constexprs, attrs)
    options = {"num_warps": 4}
    if os.environ.get("MAXNREG"):
        options["maxnreg"] = int(os.environ["MAXNREG"])
    return _cubin_report(source, options, f"{fmt}{heads}")


@pytest.mark.parametrize(
    "fmt,heads,form",
    [
        ("mxfp4", 10, ""),
        ("mxfp4", 64, ""),
        ("mxfp4", 128, ""),
        ("mxfp4", 64, "max_registers=128"),
        ("mxfp4", 64, "pairs"),
        ("mxfp4", 10, "pairs"),
        ("mxfp4", 64, "pairs,max_registers=128"),
        ("mxfp4", 64, "pairs,max_registers=128,persistent"),  # default below 16 pages a program
        ("mxfp4", 64, "registers,max_registers=128,persistent"),  # the default from 16
        ("mxfp4", 10, "registers"),
        ("mxfp4", 128, "registers"),
        # uncapped: Triton 3.9's build (CI's) spills at 128 and serialises the MMAs; the
        # H200's Triton 3.6 holds the overlapped form in 128 registers without spilling
        ("mxfp4", 64, "registers,overlap,persistent"),
        ("fp8", 64, ""),
        ("fp8", 64, "overlap"),
        ("fp8", 64, "persistent"),
    ],
)
def test_cubin_for_sm90_keeps_the_design(fmt, heads, form, tmp_path):
    env = dict(os.environ)
    parts = form.split(",")
    overlap = "overlap" in parts
    env["OVERLAP"] = str(int(overlap))
    env["PAIRS"] = str(int("pairs" in parts))
    env["PERSISTENT"] = str(int("persistent" in parts))
    env["REGISTERS"] = str(int("registers" in parts))
    for part in parts:
        if part.startswith("max_registers="):
            env["MAXNREG"] = part.split("=")[1]
    # The Triton paged kernels' leading arguments, which the Gluon kernel shares
    # (indexer_logits.paged_kernel_args), then its own.
    from tests.kernels.test_compiles_for_hopper import PAGED

    leading = {name: kind for name, kind in PAGED.items() if name != "key_rows"}
    own = {
        "SPLITS": "i32",
        "batch": "i32",
        **dict.fromkeys(
            ("H", "HP", "STAGES", "MXFP4", "OVERLAP", "PAIRS", "PERSISTENT", "REGISTERS"),
            "constexpr",
        ),
    }
    env["SIGNATURE"] = json.dumps({**leading, **own})
    out = _child_build(tmp_path, fmt, str(heads), env=env)
    regs = int(re.search(r"REG:(\d+)", out).group(1))
    spilled = int(re.search(r"STACK:(\d+)", out).group(1))
    assert "LOCAL:0" in out, out[:400]
    capped = "MAXNREG" in env
    if capped:  # a few spills, reloaded from L1, for a fourth program an SM
        assert regs <= int(env["MAXNREG"]) and spilled <= 128, (regs, spilled)
    else:
        assert spilled == 0, out[:400]
    assert "LDGSTS.E.BYPASS.128" in out  # keys by 16-byte cp.async
    assert "QGMMA" in out and "E4M3.E4M3" in out  # the fp8 warpgroup MMA
    # relu as x + |x| on the FMA pipe, no max on the half-rate ALU pipe (_store_logits)
    assert "FMNMX" not in out and re.search(r"FADD R(\d+), R(\d+), \|R\2\|", out)
    if "registers" in parts:
        # The codes are the MMA's register operand (QGMMA R_acc, R_a, gdesc), never stored:
        # the only 16-byte shared stores are the queries' (8 KiB per 64 heads, 128 threads),
        # and each of the loop's four pages has one barrier (6 more: the prologue's, the end's,
        # and in the persistent grid the request loop's).
        assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", out)
        query_stores = {10: 1, 64: 4, 128: 8}[heads]
        assert "STS.U8" not in out and out.count("STS.128") == query_stores, out[:400]
        assert out.count("BAR.SYNC") == 4 + 2 + ("persistent" in parts)
        # the queries' stores fenced from the async proxy before the first MMA reads them
        assert "FENCE.VIEW.ASYNC.S" in out and out.index("FENCE.VIEW.ASYNC.S") < out.index("QGMMA")
        if overlap:  # the previous page's logits stored between a page's MMA and its wait
            windows = re.findall(r"QGMMA.*?WARPGROUP\.DEPBAR", out, re.S)
            assert sum("STG" in window for window in windows) >= 4, len(windows)
    elif fmt == "mxfp4":
        assert "STS.128" in out and "STS.U8" not in out  # codes stored 16 bytes at a time
        if heads <= 64 and not capped:  # 3 programs an SM (128 heads: 2 accumulators' worth)
            assert regs <= 168, regs
    elif not overlap:
        assert regs <= 96, regs  # the keys never pass through registers
    else:
        assert regs <= 128, regs  # two pages' products: 4 programs an SM by registers
        # The previous page's logits are stored between a page's MMA and the wait for it.
        mma = out.index("QGMMA")
        assert "STG" in out[mma : out.index("WARPGROUP.DEPBAR", mma)]


def test_register_form_page_is_one_product_one_barrier_and_its_stores():
    """bench/paged_logits_sass.py's page of the default mxfp4 form (registers, capped at 128):
    the path a folding page takes is one K=128 product (4 k-steps), one barrier, its two rows'
    logit stores a thread, and no spill reload."""
    pytest.importorskip("triton.experimental.gluon")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run(
        [sys.executable, "bench/paged_logits_sass.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    line = child.stdout.strip().splitlines()[-1]
    assert re.search(r"a page: \d+ instructions, ALU pipe \d+", line), line
    assert "MMA k-steps 4, barriers 1, logit stores 2, spill loads 0" in line, line


MLA_SPEC = OpSpec(
    op="sparse_mla.decode",
    dtype="bfloat16",
    formats=("fp8_ds_mla",),
    head_dim=576,
    device_type="cuda",
    arch="sm_90",
)


def test_sparse_mla_refusals_name_what_the_kernel_needs(monkeypatch):
    monkeypatch.delenv("HWRUN_GLUON", raising=False)
    assert any("HWRUN_GLUON is off" in r for r in gluon._sparse_mla_validate(MLA_SPEC))
    monkeypatch.setenv("HWRUN_GLUON", "1")
    assert [r for r in gluon._sparse_mla_validate(MLA_SPEC) if "CUDA device" not in r] == []
    cases = {
        "sm_100": OpSpec(**{**MLA_SPEC.__dict__, "arch": "sm_100"}),
        "latent format": OpSpec(**{**MLA_SPEC.__dict__, "formats": ("bf16",)}),
        "query dtype": OpSpec(**{**MLA_SPEC.__dict__, "dtype": "float16"}),
        "head_dim must be 576": OpSpec(**{**MLA_SPEC.__dict__, "head_dim": 512}),
    }
    for needle, spec in cases.items():
        assert any(needle in r for r in gluon._sparse_mla_validate(spec)), needle


def test_sparse_mla_ranks_under_flashmla(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(device_checks, "_cuda_available", lambda: True)
    monkeypatch.setenv("HWRUN_GLUON", "1")
    for has_flashmla, chosen in ((False, "gluon"), (True, "flashmla")):
        monkeypatch.setattr("hwrun_nvidia.flashmla.importable", lambda name, v=has_flashmla: v)
        registry = OpRegistry("nvidia")
        plugin.hwrun_register_ops(registry)
        assert registry.select(MLA_SPEC).impl.name == chosen
    monkeypatch.setenv("HWRUN_GLUON", "0")
    assert registry.select(MLA_SPEC).impl.name == "flashmla"


def test_sparse_mla_shape_reasons_and_splits():
    from hwrun_nvidia import gluon_sparse_mla as kernel

    q = torch.zeros(2, 1, 128, 576, dtype=torch.bfloat16)
    cache = torch.zeros(8, 64, 656, dtype=torch.uint8)
    assert kernel.shape_reasons(q, cache, "fp8_ds_mla") == []
    assert kernel.shape_reasons(q, cache, "bf16")
    assert kernel.shape_reasons(q.half(), cache, "fp8_ds_mla")
    assert kernel.shape_reasons(q[..., :512], cache, "fp8_ds_mla")
    assert kernel.shape_reasons(q, torch.zeros(8, 64, 1152, dtype=torch.uint8), "fp8_ds_mla")
    odd = torch.zeros(8, 64, 672, dtype=torch.uint8)[:, :, :656]  # rows of 672 B: aligned
    assert kernel.shape_reasons(q, odd, "fp8_ds_mla") == []
    skewed = torch.zeros(8, 64, 660, dtype=torch.uint8)[:, :, :656]  # 660: not 16-byte
    assert any("16-byte" in r for r in kernel.shape_reasons(q, skewed, "fp8_ds_mla"))
    assert kernel.default_splits(64, 2, 2048, 132) == 1  # 128 programs: one wave already
    assert kernel.default_splits(1, 2, 2048, 132) == 16  # at least 2 tiles a part
    assert kernel.default_splits(4, 2, 2048, 132) == 16
    assert kernel.default_splits(8, 2, 2048, 132) == 8  # one wave
    assert kernel.default_splits(1, 1, 64, 132) == 1


def test_sparse_mla_falls_back_to_triton_for_other_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(
        "hwrun.kernels.triton.sparse_mla.decode", lambda *args: calls.append(args) or "triton"
    )
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    bf16_cache = torch.zeros(1, 64, 1152, dtype=torch.uint8)
    slots = torch.zeros(1, 1, 4, dtype=torch.int32)
    assert gluon.sparse_mla_decode(q, bf16_cache, "bf16", slots, 0.1) == "triton"
    assert len(calls) == 1


def _build_specialised(heads: int) -> str:
    """In the child: the warp-specialised mxfp4 kernel's sm_90 cubin for ``heads`` query
    heads at the default ring (gluon_paged_logits_ws.logits_paged's 12 stages, 8 ahead)."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from hwrun_nvidia import gluon_paged_logits_ws as kernel

    # the descriptors' types as a launch specialises them, from descriptors of a host tensor
    # of the cache's row shape
    words, scales = kernel.page_descriptors(torch.zeros(4, 64 * 68, dtype=torch.uint8))
    pointers = {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32"}
    descriptors = {"words_desc": mangle_type(words), "scales_desc": mangle_type(scales)}
    rest = {"table_ptr": "*i32", "lens_ptr": "*i32", "out_ptr": "*fp32"}
    ints = ("table_stride", "out_stride", "max_ctx", "num_ctx_blocks", "batch")
    signature = pointers | descriptors | rest | dict.fromkeys(ints, "i32")
    constexprs = {"H": heads, "HP": max(16, triton.next_power_of_2(heads)), "STAGES": 12, "LAG": 8}
    signature |= dict.fromkeys(constexprs, "constexpr")
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 4, 5, 6)}
    source = GluonASTSource(kernel._paged_logits_ws_kernel, signature, constexprs, attrs)
    return _cubin_report(source, {"num_warps": 4}, f"specialised{heads}")


@pytest.mark.parametrize("heads", [64, 10])
def test_specialised_mxfp4_cubin_keeps_the_design(heads, tmp_path):
    out = _child_build(tmp_path, "specialised", str(heads))
    shared = int(re.search(r"SHARED_BYTES:(\d+)", out).group(1))
    assert shared <= 232448, shared
    assert re.search(r"STACK:0\b", out), out[:400]  # no partition spills
    # The partitions' registers set apart; the ring handed over by mbarriers
    assert "USETMAXREG.TRY_ALLOC" in out and "USETMAXREG.DEALLOC" in out
    assert "SYNCS.ARRIVE" in out and "SYNCS.PHASECHK" in out
    # Four loader warps, each a page's keys and scale words by two TMA copies; no cp.async
    assert out.count("UTMALDG.3D") == 8 and "LDGSTS" not in out
    # Three consumers, each the register form's product (the codes the MMA's register
    # operand) and its four products' loop: 8 k-steps each
    operand = re.findall(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", out)
    assert len(operand) == 24, len(operand)
    # the relu on the FMA pipe, as the register form's (_store_logits)
    assert "FMNMX" not in out and re.search(r"FADD R(\d+), R(\d+), \|R\2\|", out)


def test_specialised_form_refuses_what_it_does_not_take():
    """On the host, before any launch."""
    from hwrun_nvidia import gluon_paged_logits as kernel

    q = torch.zeros(1, 1, 64, 128).to(torch.float8_e4m3fn)
    w, table, lens = torch.zeros(1, 64), torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1)
    cache = torch.zeros(4, 64 * 68, dtype=torch.uint8)
    for options, needle in [
        ({"pairs": True}, "its own grid"),
        ({"overlap": True}, "its own grid"),
        ({"max_registers": None}, "its own grid"),
        ({"stages": 4}, "stages >= 5"),
    ]:
        with pytest.raises(ValueError, match=needle):
            kernel.logits_paged(q, w, cache, "mxfp4", table, lens, 256, specialised=True,
                                **options)  # fmt: skip
    with pytest.raises(ValueError, match="at most 64 heads"):
        kernel.logits_paged(torch.cat([q, q], 2), w, cache, "mxfp4", table, lens, 256,
                            specialised=True)  # fmt: skip
    with pytest.raises(ValueError, match="form of the mxfp4 kernel"):
        kernel.logits_paged(q, w, cache, "fp8", table, lens, 256, specialised=True)


def _build_sparse_mla(stages: int, crossover: bool) -> str:
    """In the child: the sparse MLA kernel's sm_90 cubin, as its shared-memory size, then
    cuobjdump's resource usage and SASS; crossed over, first the buffers' offsets the launch
    finds (``OFFSETS:``)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from hwrun_nvidia import gluon_sparse_mla as kernel

    pointers = ("*bf16", "*u8", "*i32", "*i32", "*fp32", "*bf16", "*fp32")
    names = ("q_ptr", "cache_ptr", "slots_ptr", "lens_ptr", "sink_ptr", "part_out_ptr")
    signature = dict(zip((*names, "part_lse_ptr"), pointers, strict=True))
    ints = ("k", "H", "chunk", "block_size", "cache_block_stride", "cache_row_stride")
    signature |= dict.fromkeys(ints, "i32") | {"scale_log2": "fp32"}
    offsets = ("nope_offset", "rope_offset", "ready_offset", "peer_free_offset", "signal_offset")
    signature |= dict.fromkeys(offsets, "i32")
    signature |= dict.fromkeys(("HAS_LENS", "HAS_SINK", "STAGES", "CROSSOVER"), "constexpr")
    # As a launch specialises them: 16-byte aligned pointers and strides of 16 B units.
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 11, 12)}
    constexprs = {"HAS_LENS": True, "HAS_SINK": True, "STAGES": stages, "CROSSOVER": crossover}
    source = GluonASTSource(kernel._sparse_mla_decode_ws_kernel, signature, constexprs, attrs)
    name = f"sparse_mla{stages}{'x' if crossover else ''}"
    if not crossover:
        return _cubin_report(source, {"num_warps": 4}, name)
    import triton
    from triton.backends.compiler import GPUTarget

    offsets = kernel._crossover_offsets(triton.compile(source, GPUTarget("cuda", 90, 32), {}))
    return f"OFFSETS:{','.join(map(str, offsets))}\n" + _cubin_report(source, {}, name)


def test_warp_specialised_sparse_mla_cubin_keeps_the_design(tmp_path):
    out = _child_build(tmp_path, "sparse_mla", "2", "0")  # two ring stages, the default
    shared = int(re.search(r"SHARED_BYTES:(\d+)", out).group(1))
    assert shared <= 232448, shared
    spilled = int(re.search(r"STACK:(\d+)", out).group(1))
    assert spilled <= 128, spilled
    # Three warpgroups: the partitions' registers set apart (setmaxnreg), the stages and P
    # handed over by mbarriers.
    assert "USETMAXREG.TRY_ALLOC" in out and "USETMAXREG.DEALLOC" in out
    assert "SYNCS.ARRIVE" in out and "SYNCS.PHASECHK" in out
    # QK by one warpgroup over the whole tile: 32 NoPE and 4 RoPE steps of 64 x 64; PV by
    # both consumers: 4 steps of 64 x 256 each, V as stored
    assert out.count("HGMMA.64x64x16.F32.BF16") == 36
    assert out.count("HGMMA.64x256x16.F32.BF16 ") == 8 and "tnspB" in out
    assert "LDG.E.128" in out and "STS.128" in out
    # The codes placed in bf16 bits and scaled by the bf16 multiply, no conversions
    assert "F2FP.F16.E4M3.UNPACK_B" not in out
    assert out.count("PRMT") >= 128 and "HMUL2.BF16" in out
    assert "STAS" not in out and "UCGABAR" not in out  # one CTA: no cluster


def test_crossover_sparse_mla_cubin_stores_halves_into_the_pair(tmp_path):
    out = _child_build(tmp_path, "sparse_mla", "2", "1")
    offsets = re.search(r"OFFSETS:([\d,]+)", out).group(1).split(",")
    nope, rope, ready, peer_free, signal = map(int, offsets)
    shared = int(re.search(r"SHARED_BYTES:(\d+)", out).group(1))
    assert shared <= 232448, shared
    # The buffers as the kernel declares them: two stages of [64, 512] and [64, 64] bf16 (1 KB
    # aligned, as the 128-byte swizzle needs), two 8-byte barriers of each kind, 2 x 512 bytes
    # of signals, none overlapping.
    spans = sorted(
        [(nope, 2 * 65536), (rope, 2 * 8192), (ready, 16), (peer_free, 16), (signal, 1024)]
    )
    assert nope % 1024 == 0 and rope % 1024 == 0
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(spans))
    assert sum(spans[-1]) <= shared
    spilled = int(re.search(r"STACK:(\d+)", out).group(1))
    assert spilled <= 128, spilled  # as the one-CTA kernel: the loops' asm does not spill
    # Each tile's half stored into the peer from the decoding registers, 16 bytes a store (18 a
    # thread; Triton 3.6 keeps a copy in each rank's branch, 3.9 one), the producers' signals,
    # the cluster synchronised at each partition's start and end; QK as in the one-CTA kernel.
    assert out.count("STAS.128") in (18, 36) and "STAS " in out
    assert out.count("UCGABAR_ARV") == 6 and out.count("UCGABAR_WAIT") == 6
    assert out.count("HGMMA.64x64x16.F32.BF16") == 36


if __name__ == "__main__":
    if sys.argv[1] == "layouts":
        print(_layouts())
    elif sys.argv[1] == "specialised":
        print(_build_specialised(int(sys.argv[2])))
    elif sys.argv[1] == "sparse_mla":
        print(_build_sparse_mla(int(sys.argv[2]), sys.argv[3] == "1"))
    else:
        print(_build(sys.argv[1], int(sys.argv[2])))
