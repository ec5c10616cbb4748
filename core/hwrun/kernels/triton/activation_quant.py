"""Activations quantized per token and 128 columns to e4m3, byte-exact to hwrun.formats.

``quantize_activations(x, ue8m0)`` gives what ``hwrun.formats.fp8.quantize_fp8_groups(x, 128,
ue8m0)`` gives: codes ``[T, C]`` uint8 and scales ``[T, C / 128]`` fp32, bit for bit. It is
``dense.linear_a8w8``'s first step (DeepSeek's ``act_quant``), one launch before the GEMM: a
GEMM program that quantized its own row tile would redo it for every output tile, and the exact
division (``div_rn``) and e4m3 rounding (kv_write's bit arithmetic, the same on every backend)
would then sit in its inner loop.

One program per token row and 8 groups (1024 columns) of it, as one ``[8, 128]`` tile: a decode
step's 64 rows of 4096 columns are 256 programs (one per row left most SMs idle: 3.2 us a call
on the H200 at 64 x 4096).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.formats.fp8 import BLOCK
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.kv_write import e4m3_bits, pow2_bits
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

GROUPS_PER_PROGRAM = 8


@triton.jit
def e4m3_groups(x, UE8M0: tl.constexpr):
    """e4m3 codes (uint8) and fp32 scales of ``x`` [R, G] fp32, one group a row, by the rule of
    hwrun.formats.fp8 (also the fused MoE's a8w8 intermediate, which a gate/up tile holds whole).
    """
    # max(amax, 1e-4) / 448, correctly rounded; with ue8m0 rounded up to a power of two on its
    # bits, and the elements scaled by its exact inverse.
    amax = tl.maximum(tl.max(tl.abs(x), 1), 1e-4)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    if UE8M0:
        bits = s.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        s = pow2_bits(e)
        codes = e4m3_bits(x * pow2_bits(254 - e)[:, None])
    else:
        codes = e4m3_bits(tl.math.div_rn(x, tl.broadcast_to(s[:, None], x.shape)))
    return codes, s


@triton.jit
def _quantize_rows_kernel(
    x_ptr,  # [T, C] float, row stride stride_x
    codes_ptr,  # [T, C] uint8
    scales_ptr,  # [T, C / 128] float32, strides (stride_s_row, stride_s_group)
    C,
    stride_x,
    stride_s_row,
    stride_s_group,
    UE8M0: tl.constexpr,
    GROUPS: tl.constexpr,  # groups per program, a power of two
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    col = g[:, None] * 128 + tl.arange(0, 128)[None, :]
    mask = col < C
    x = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    codes, s = e4m3_groups(x, UE8M0)
    tl.store(codes_ptr + row * C + col, codes, mask=mask)
    tl.store(scales_ptr + row * stride_s_row + g * stride_s_group, s, mask=g < C // 128)


def empty_scales(
    tokens: int, groups: int, device: torch.device, token_major: bool
) -> torch.Tensor:  # [tokens, groups] float32
    """Room for ``tokens`` x ``groups`` activation scales: rows first, or tokens first with each
    group's column 16-byte aligned (strides ``(1, tokens rounded up to 4)``)."""
    if not token_major:
        return torch.empty(tokens, groups, dtype=torch.float32, device=device)
    padded = -(-tokens // 4) * 4
    return torch.empty(groups, padded, dtype=torch.float32, device=device)[:, :tokens].t()


def quantize_activations(
    x: torch.Tensor,  # [T, C] float, C a multiple of 128
    ue8m0: bool,
    token_major_scales: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # codes [T, C] uint8, scales [T, C / 128] float32
    """``quantize_fp8_groups(x, 128, ue8m0)`` in one launch (shape checks only: nothing here
    reads a device value, so a CUDA graph can capture it).

    ``token_major_scales``: the scales laid out tokens first (strides ``(1, T4)``, ``T4`` = T
    rounded up to 4, so each group's column starts 16-byte aligned): the layout DeepGEMM's
    SM90 fp8 GEMMs read through TMA. Given row-major scales they transpose them first, one more
    launch per GEMM."""
    if x.dim() != 2 or x.shape[1] % BLOCK or not x.is_floating_point():
        raise ValueError(
            f"quantize_activations: x must be a float [T, C] tensor with C a multiple of "
            f"{BLOCK}, got {x.dtype} {list(x.shape)}"
        )
    t, c = x.shape
    codes = torch.empty(t, c, dtype=torch.uint8, device=x.device)
    scales = empty_scales(t, c // BLOCK, x.device, token_major_scales)
    if t == 0:
        return codes, scales
    prepare_launch()
    if x.stride(-1) != 1:
        x = x.contiguous()
    groups = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(c // BLOCK))
    _quantize_rows_kernel[(t, triton.cdiv(c // BLOCK, groups))](
        x, codes, scales, c, x.stride(0), scales.stride(0), scales.stride(1),
        UE8M0=ue8m0, GROUPS=groups, num_warps=4,
        **pdl_options(x.device),
    )  # fmt: skip
    return codes, scales
