"""The Gluon top-k kernels off the GPU: the hooks' refusals, and both kernels' sm_90 cubins built
by Triton's own compiler (in a child process, as test_gluon.py builds the others), read with
cuobjdump for what the design promises: the threshold search's one barrier a round (5 in the
kernel: the bracket, the loop's two rounds, the one before the loop, the list), each count
summed inside its warp by one REDUX, a compaction without barriers, and no spills. Numerics:
test_gluon_topk_gpu.py, on a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from hwrun_nvidia import gluon_topk


def test_hooks_leave_what_they_cannot_hold_to_triton():
    """False (no launch) where the tile would not hold whole warp rows: the Triton kernel then
    runs. Nothing is launched, so CPU tensors do."""
    seg_max = torch.zeros(2, 520, dtype=torch.int32)
    rows = (torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    outputs = tuple(torch.zeros(2, dtype=torch.int32) for _ in range(4))
    assert not gluon_topk.threshold(rows, seg_max, outputs, 4000, 16, 512, 8, 4, 16)
    assert not gluon_topk.threshold(rows, seg_max, outputs, 4000, 16, 1536, 24, 4, 16)
    cand = torch.zeros(2, 2, 1024, dtype=torch.int32)
    out = torch.zeros(2, 16, dtype=torch.int32)
    logits = torch.zeros(2, 4000)
    assert not gluon_topk.select(
        logits, rows, outputs[0], outputs[1], cand, out, 4000, 16, 1024, 12, 1024, 16
    )


def _build() -> str:
    """In the child: both kernels' sm_90 cubins (the bench's constexprs), as cuobjdump's
    resource usage and SASS, each after a ``KERNEL:`` line."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    ints = ("starts_ptr", "ends_ptr")
    threshold = dict.fromkeys((*ints, "max_ptr", "thresh_ptr", "count_ptr", "live_ptr"), "*i32")
    threshold |= {"nlive_ptr": "*i32", "L": "i32", "k": "i32"}
    select = {"logits_ptr": "*fp32"} | dict.fromkeys(ints, "*i32")
    select |= dict.fromkeys(("thresh_ptr", "count_ptr", "cand_key_ptr", "cand_idx_ptr"), "*i32")
    select |= {"out_ptr": "*i32", "row_stride": "i32", "L": "i32", "k": "i32"}
    compact = {"logits_ptr": "*fp32"} | dict.fromkeys((*ints, "live_ptr", "nlive_ptr"), "*i32")
    compact |= dict.fromkeys(("thresh_ptr", "count_ptr", "cand_key_ptr", "cand_idx_ptr"), "*i32")
    compact |= {"row_stride": "i32", "L": "i32", "k": "i32"}
    kernels = (
        ("threshold", gluon_topk._threshold_kernel, threshold,
         {"M": 8192, "SLACK": 128, "LEVELS": 6, "BITS": 16, "PDL": True}),
        ("select", gluon_topk._select_kernel, select,
         {"CAP": 8192, "IDX_BITS": 17, "BLOCK": 1024, "K_BLOCK": 2048, "PDL": True}),
        ("compact", gluon_topk._compact_kernel, compact,
         {"M": 8192, "SLACK": 128, "LEVELS": 6, "CAP": 8192, "BLOCK": 1024, "PDL": True}),
    )  # fmt: skip
    report = ""
    for name, kernel, signature, constexprs in kernels:
        pointers = [i for i, kind in enumerate(signature.values()) if kind.startswith("*")]
        attrs = {(i,): [["tt.divisibility", 16]] for i in pointers}  # as a launch finds them
        signature = signature | dict.fromkeys(constexprs, "constexpr")
        source = GluonASTSource(kernel, signature, constexprs, attrs)
        compiled = triton.compile(source, GPUTarget("cuda", 90, 32), {"num_warps": 8})
        path = os.path.join(os.environ["OUT_DIR"], f"{name}.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True)
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True)
        report += f"KERNEL:{name}\n{usage.stdout}{sass.stdout}"
    return report


def test_cubins_for_sm90_keep_the_design(tmp_path):
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OUT_DIR"] = str(tmp_path)
    child = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-3000:]
    _, threshold, select, compact = child.stdout.split("KERNEL:")
    for sass in (threshold, select, compact):
        assert re.search(r"STACK:0 ", sass), "spilled"
        assert "REDUX.SUM" in sass  # counts summed inside each warp
    # One barrier a round: 2 in the search loop, 1 before it, 1 for the bracket, 1 for the
    # list (Triton's reductions would put 3 in each round).
    assert threshold.count("BAR.SYNC") == 5, threshold.count("BAR.SYNC")
    # The compaction's warps never wait on each other: one atomic a warp a tile, ranks by a
    # scan inside the warp; 32 registers, so 8 programs of 8 warps fit a multiprocessor.
    assert "BAR.SYNC" not in compact and compact.count("ATOMG") == 1
    assert re.search(r"REG:(\d+)", compact) and int(re.search(r"REG:(\d+)", compact).group(1)) <= 32


if __name__ == "__main__":
    print(_build())
