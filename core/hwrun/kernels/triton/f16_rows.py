"""bf16 activations as f16 with a power-of-two scale per row and column group, so the GEMMs over
e4m3 weights can multiply in f16.

Why: e4m3 codes reach f16 in one conversion for two codes (``cvt.rn.f16x2.e4m3x2``) but bf16
only through f16 and one more quarter-rate conversion per code; on the H200 the fused MoE's
gate/up kernel over bf16 products kept the conversion pipe 81% busy and read 54% of the copy
rate (docs/benchmarks.md).

Exactness: a row group times ``2^s``, with ``s`` putting its largest magnitude in [2^14, 2^15),
is exact (a power of two). f16's normal range then holds every value from the group's largest
down to 2^-29 of it with bf16's 8 significant bits, so those convert exactly; smaller values
round in f16's subnormals, an error of at most 2^-39 of the group's largest magnitude, far below
the fp32 sums' own rounding. The product is scaled back by ``2^-s`` (also exact). Zero, inf and
NaN pass through (an inf or NaN group's finite values underflow to 0; the product is inf or NaN
as the bf16 product would be).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

GROUP = 128  # the K step of every kernel that reads these tiles divides it
# Weight formats whose codes (e4m3) are exact in f16, so f16 products apply to them.
F16_WEIGHT_FORMATS = ("fp8_block128", "fp8_block128_ue8m0")


@triton.jit
def to_scaled_f16(values):
    """``values`` [R, C] (fp32 holding bf16 values) as f16 times each row's ``2^s``, and the
    rows' ``2^-s`` [R] (fp32) that undo it."""
    amax = tl.max(tl.abs(values), axis=1)
    exponent = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    s = tl.minimum(tl.maximum(14 - exponent, -126), 126)  # 2^s and 2^-s are normal fp32
    up = ((s + 127) << 23).to(tl.float32, bitcast=True)
    down = ((127 - s) << 23).to(tl.float32, bitcast=True)
    return (values * up[:, None]).to(tl.float16), down


@triton.jit
def _rows_to_f16_kernel(
    x_ptr,  # [T, D] any float
    out_ptr,  # [T, D] f16
    scale_ptr,  # [T, ceil(D / GROUP)] fp32
    D,
    GROUP_SIZE: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    """One row's one column group."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    cols = group * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0)
    scaled, down = to_scaled_f16(x.to(tl.bfloat16).to(tl.float32)[None, :])
    tl.store(out_ptr + row * D + cols[None, :], scaled, mask=mask[None, :])
    tl.store(scale_ptr + row * tl.num_programs(1) + group + tl.arange(0, 1), down)


def rows_to_f16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [T, D] rounded to bf16 (the contract's activation rounding), as f16 [T, D] and the
    fp32 ``2^-s`` [T, ceil(D / 128)] of each row's 128-column groups (see the module doc)."""
    tokens, hidden = x.shape
    groups = triton.cdiv(hidden, GROUP)
    out = torch.empty(tokens, hidden, dtype=torch.float16, device=x.device)
    scales = torch.empty(tokens, groups, dtype=torch.float32, device=x.device)
    if tokens:
        prepare_launch()
        _rows_to_f16_kernel[(tokens, groups)](
            x.contiguous(), out, scales, hidden, GROUP, **pdl_options(x.device)
        )
    return out, scales
