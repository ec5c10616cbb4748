"""The engine's RMSNorm (optionally after its residual add) with the norm's output quantized per
token and 128 columns in the same launch: what ``dense.linear_a8w8`` quantizes first, written
beside the bf16 output so the linear reads it (``quantized=``) instead of launching
activation_quant.py's kernel.

``y = weight * bf16(x * rsqrt(mean(x^2) + eps))`` as ``hwrun.engine.fused.rms_norm`` computes
it (x widened to fp32, the normalised row rounded to x's dtype, then the product with the bf16
weight rounded again), with ``x = bf16(h + delta)`` first when a residual is added (the new
residual is written too). The codes and scales are those of ``y`` as written, byte-exact to
``hwrun.formats.fp8.quantize_fp8_groups(y, 128, ue8m0)`` (activation_quant.py's
``e4m3_groups``). The norm itself differs from the compiled torch function by the order of the
sum of squares and the square root's rounding (``sqrt_rn`` then ``div_rn`` here), as the
compiled function differs from eager torch; the engine's GPU tests bound that.

One program per row, the whole row in registers (4096 bf16 columns are 16 fp32 values a thread
at 8 warps), so one read of the row serves the sum, the normalised output and its quantization.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.formats.fp8 import BLOCK
from hwrun.kernels.triton.activation_quant import e4m3_groups, empty_scales
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel


@triton.jit
def _norm_quantize_kernel(
    h_ptr,  # [T, C] bf16, row stride stride_h: the residual stream (or the norm's input)
    delta_ptr,  # [T, C] bf16, row stride stride_d: added to h first (HAS_DELTA)
    h_out_ptr,  # [T, C] bf16 contiguous: h + delta (HAS_DELTA)
    w_ptr,  # [C] bf16
    y_ptr,  # [T, C] bf16 contiguous
    codes_ptr,  # [T, C] uint8 contiguous
    scales_ptr,  # [T, C / 128] fp32, strides (stride_s_row, stride_s_group)
    C,
    stride_h,
    stride_d,
    stride_s_row,
    stride_s_group,
    eps,
    HAS_DELTA: tl.constexpr,
    UE8M0: tl.constexpr,
    GROUPS: tl.constexpr,  # 128-column groups a program holds, a power of two >= C / 128
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS)
    col = g[:, None] * 128 + tl.arange(0, 128)[None, :]  # [GROUPS, 128]
    mask = col < C
    h = tl.load(h_ptr + row * stride_h + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * stride_d + col, mask=mask, other=0.0).to(tl.float32)
        h_new = (h + d).to(h_out_ptr.dtype.element_ty)  # torch's bf16 add: one rounding
        tl.store(h_out_ptr + row * C + col, h_new, mask=mask)
        h = h_new.to(tl.float32)
    mean = tl.sum(tl.sum(h * h, 1), 0) / C
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(mean + eps))
    normed = (h * inv).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * C + col, y, mask=mask)
    codes, s = e4m3_groups(y.to(tl.float32), UE8M0)
    tl.store(codes_ptr + row * C + col, codes, mask=mask)
    tl.store(scales_ptr + row * stride_s_row + g * stride_s_group, s, mask=g * 128 < C)


def rms_norm_quantize(
    x: torch.Tensor,  # [T, C] bf16, C a multiple of 128
    weight: torch.Tensor,  # [C] bf16
    eps: float,
    ue8m0: bool = False,
    token_major_scales: bool = False,
    delta: torch.Tensor | None = None,  # [T, C]: the residual add first
) -> tuple[torch.Tensor | None, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``(x + delta or None, y, (codes, scales))``: the new residual (with ``delta``), the norm's
    output and its e4m3 codes [T, C] uint8 and scales [T, C / 128] fp32 (tokens first, 16-byte
    aligned, with ``token_major_scales``: activation_quant.py's layouts). One launch; shape
    checks only, nothing here reads a device value (a CUDA graph can capture it)."""
    problems = []
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] % BLOCK:
        problems.append(f"x must be bf16 [T, C], C a multiple of {BLOCK}, got {x.dtype} "
                        f"{list(x.shape)}")  # fmt: skip
    if weight.shape != x.shape[1:] or weight.dtype != x.dtype:
        problems.append(f"weight must be {x.dtype} {list(x.shape[1:])}, got {weight.dtype} "
                        f"{list(weight.shape)}")  # fmt: skip
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        problems.append(f"delta must be like x, got {delta.dtype} {list(delta.shape)}")
    if problems:
        raise ValueError("rms_norm_quantize: " + "; ".join(problems))
    t, c = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    codes = torch.empty(t, c, dtype=torch.uint8, device=x.device)
    scales = empty_scales(t, c // BLOCK, x.device, token_major_scales)
    h_new = torch.empty_like(y) if delta is not None else None
    if t:
        prepare_launch()
        if x.stride(-1) != 1:
            x = x.contiguous()
        if delta is not None and delta.stride(-1) != 1:
            delta = delta.contiguous()
        groups = triton.next_power_of_2(c // BLOCK)
        _norm_quantize_kernel[(t,)](
            x, delta if delta is not None else x, h_new if h_new is not None else y,
            weight.contiguous(), y, codes, scales, c, x.stride(0),
            delta.stride(0) if delta is not None else 0, scales.stride(0), scales.stride(1),
            float(eps), HAS_DELTA=delta is not None, UE8M0=ue8m0, GROUPS=groups,
            num_warps=8 if groups >= 16 else 4, **pdl_options(x.device),
        )  # fmt: skip
    return h_new, y, (codes, scales)
