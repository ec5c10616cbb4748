"""Instructions a page of the Gluon paged-logits kernel's mxfp4 register form (the default from
16 pages a program), counted in its sm_90 SASS, on CPU.

Usage: ``python bench/paged_logits_sass.py [--stages 4] [--overlap] [--max-registers 128]
[--heads 64] [--sass FILE]``.

Builds ``hwrun_nvidia.gluon_paged_logits``'s register form on the persistent grid for sm_90 with
the installed Triton (no GPU needed), then follows one page of the loop (a barrier a page; the
other forms' loops have other shapes): from its third page's barrier to its fourth's, the shortest
path with no backward branch, which is the page that folds (the four-product path holds a
loop). Prints the registers and spill bytes a thread and that path's instructions by pipe: sm_90
runs the ALU pipe (logic, permutes, shifts, compares, min/max, integer adds) at half rate, the
FMA pipe (float math, IMAD) at full. Counts differ between Triton versions: the device's is 3.6,
CI's 3.9.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

ALU = ("LOP3", "PRMT", "SEL", "FSEL", "SHF", "ISETP", "FMNMX", "VIMNMX", "IADD3", "LEA", "PLOP3",
       "FSETP", "VIADD", "MOV")  # fmt: skip
FMA = ("IMAD", "FFMA", "FADD", "FMUL")
# The kernel's arguments as a launch specialises them (indexer_logits.paged_kernel_args order).
SIGNATURE = {
    "q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "cache_ptr": "*u8", "table_ptr": "*i32",
    "lens_ptr": "*i32", "out_ptr": "*fp32", "cache_block_stride": "i64", "table_stride": "i32",
    "out_stride": "i32", "max_ctx": "i32", "num_ctx_blocks": "i32", "SPLITS": "i32", "batch": "i32",
}  # fmt: skip


def build_sass(args) -> tuple[str, str]:
    """The kernel's SASS and ptxas's resource line."""
    from hwrun_nvidia import gluon_paged_logits as kernel

    padded = max(16, triton.next_power_of_2(args.heads))
    constexprs = {"H": args.heads, "HP": padded, "STAGES": args.stages, "MXFP4": True,
                  "OVERLAP": args.overlap, "PAIRS": False, "PERSISTENT": True,
                  "REGISTERS": True}  # fmt: skip
    signature = {**SIGNATURE, **dict.fromkeys(constexprs, "constexpr")}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}
    source = GluonASTSource(kernel._paged_logits_kernel, signature, constexprs, attrs)
    options = {"num_warps": 4}
    if args.max_registers:
        options["maxnreg"] = args.max_registers
    compiled = triton.compile(source, GPUTarget("cuda", 90, 32), options)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.TemporaryDirectory() as scratch:
        cubin = os.path.join(scratch, "paged_logits_sm90.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage, sass = (
            subprocess.run([cuobjdump, flag, cubin], capture_output=True, text=True).stdout
            for flag in ("-res-usage", "-sass")
        )
    return sass, re.search(r"REG:\d+ STACK:\d+", usage).group(0)


def page_path(sass: str) -> list[str]:
    """The instructions from the 4th barrier to the 5th (one before the loop, then one a page:
    the loop's third page) along the shortest path that never branches backward."""
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)
    code = [(int(a, 16), text.strip()) for a, text in found]
    index = {a: i for i, (a, _) in enumerate(code)}
    barriers = [i for i, (_, text) in enumerate(code) if text.startswith("BAR.SYNC")]
    start, goal = barriers[3], barriers[4]
    distance, previous, queue = {start: 0}, {}, [(0, start)]
    while queue:
        d, i = heapq.heappop(queue)
        if i == goal:
            break
        branch = re.match(r"(@!?U?P\w+ )?BRA (0x[0-9a-f]+)", code[i][1])
        nexts = [i + 1] if not branch or branch.group(1) else []
        if branch and index[int(branch.group(2), 16)] > i:
            nexts.append(index[int(branch.group(2), 16)])
        for j in nexts:
            if d + 1 < distance.get(j, 1 << 30):
                distance[j], previous[j] = d + 1, i
                heapq.heappush(queue, (d + 1, j))
    path = [goal]
    while path[-1] != start:
        path.append(previous[path[-1]])
    return [code[i][1] for i in reversed(path[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--max-registers", type=int, default=128, help="0: uncapped")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--sass", help="also write the SASS here")
    args = parser.parse_args()
    sass, usage = build_sass(args)
    if args.sass:
        with open(args.sass, "w") as f:
            f.write(sass)
    pipes, ops = collections.Counter(), collections.Counter()
    for text in page_path(sass):
        op = re.sub(r"^@!?U?P\w+ ", "", text).split()[0]
        ops[op.split(".")[0]] += 1
        if op not in ("BRA", "NOP"):
            pipes["ALU" if op.startswith(ALU) else "FMA" if op.startswith(FMA) else "other"] += 1
    print(f"Triton {triton.__version__}, {usage}, a page: {sum(pipes.values())} instructions, "
          f"ALU pipe {pipes['ALU']}, FMA pipe {pipes['FMA']}, other {pipes['other']}; "
          f"MMA k-steps {ops['QGMMA']}, barriers {ops['BAR']}, logit stores {ops['STG']}, "
          f"spill loads {ops['LDL']}")  # fmt: skip


if __name__ == "__main__":
    sys.path[:0] = ["core", "plugins/nvidia"]
    main()
