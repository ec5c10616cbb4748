"""The MLA output's per-head ``W_UV`` product with its result quantized per token and head in
the same launch: o_proj's input as ``dense.linear_a8w8`` quantizes it, written beside the bf16
values so o_proj reads it (``quantized=``) instead of launching activation_quant.py's kernel.

``values[t, h, :] = bf16(x[t, h, :] @ w[h]^T)`` for ``x [T, H, A]`` (the attention's latent
output) and ``w [H, V, A]`` (``W_UV``), fp32 sums, one rounding, as the engine's batched GEMM
computes it (the sums' order differs, so the values may differ from cuBLAS's by a bf16 unit).
With ``V = 128`` each head's values are one 128-column group of o_proj's input ``[T, H * V]``,
so a program that owns a head owns its groups whole, and their codes and scales are those of the
values as written, byte-exact to ``hwrun.formats.fp8.quantize_fp8_groups`` (activation_quant.py's
``e4m3_groups``).

One program per (token tile, head), 8 warps: a decode step of 64 rows and 64 heads is 64
programs, each reading its head's 128 x 512 weight once (128 KB). ptxas (sm_90, Triton 3.6):
255 registers at 64-row tiles without spills (at 4 warps it spilled 180 bytes), 144 at 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.formats.fp8 import BLOCK
from hwrun.kernels.triton.activation_quant import e4m3_groups, empty_scales
from hwrun.kernels.triton.index_key_tiles import wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

BLOCK_A = 128  # the K step over the latent


@triton.jit
def _head_quantize_kernel(
    x_ptr,  # [T, H, A] bf16, strides (stride_xt, stride_xh, 1)
    w_ptr,  # [H, V, A] bf16, strides (stride_wh, stride_wv, 1)
    values_ptr,  # [T, H * V] bf16 contiguous
    codes_ptr,  # [T, H * V] uint8 contiguous
    scales_ptr,  # [T, H] fp32, strides (stride_s_row, stride_s_group)
    T,
    H,
    stride_xt,
    stride_xh,
    stride_wh,
    stride_wv,
    stride_s_row,
    stride_s_group,
    A: tl.constexpr,
    V: tl.constexpr,  # 128: one scale group a head
    BLOCK_T: tl.constexpr,
    BLOCK_A: tl.constexpr,
    UE8M0: tl.constexpr,
    WIDE: tl.constexpr,  # bf16 on the matrix units (fp32 in the interpreter)
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1).to(tl.int64)
    v = tl.arange(0, V)
    rows = t < T
    acc = tl.zeros((BLOCK_T, V), tl.float32)
    for a0 in range(0, A, BLOCK_A):
        a = a0 + tl.arange(0, BLOCK_A)
        x = tl.load(
            x_ptr + t[:, None].to(tl.int64) * stride_xt + h * stride_xh + a[None, :],
            mask=rows[:, None],
            other=0.0,
        )
        w = tl.load(w_ptr + h * stride_wh + v[None, :] * stride_wv + a[:, None])  # [BLOCK_A, V]
        acc = tl.dot(x.to(WIDE), w.to(WIDE), acc)
    values = acc.to(values_ptr.dtype.element_ty)
    col = t[:, None].to(tl.int64) * (H * V) + h * V + v[None, :]
    tl.store(values_ptr + col, values, mask=rows[:, None])
    codes, s = e4m3_groups(values.to(tl.float32), UE8M0)  # one group a token row
    tl.store(codes_ptr + col, codes, mask=rows[:, None])
    tl.store(scales_ptr + t * stride_s_row + h * stride_s_group, s, mask=rows)


def head_products_quantize(
    x: torch.Tensor,  # [T, H, A] bf16, unit last stride
    w: torch.Tensor,  # [H, V, A] bf16 (V = 128), unit last stride
    ue8m0: bool = False,
    token_major_scales: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``(values [T, H * V] bf16, (codes [T, H * V] uint8, scales [T, H] fp32))``: the per-head
    products ``x[:, h] @ w[h]^T`` side by side, and their e4m3 codes and scales (tokens first,
    16-byte aligned, with ``token_major_scales``: activation_quant.py's layouts). One launch;
    shape checks only (a CUDA graph can capture it)."""
    problems = []
    if x.dim() != 3 or x.dtype != torch.bfloat16:
        problems.append(f"x must be bf16 [T, H, A], got {x.dtype} {list(x.shape)}")
    elif w.dim() != 3 or w.dtype != x.dtype or w.shape[0] != x.shape[1] or w.shape[2] != x.shape[2]:
        problems.append(
            f"w must be bf16 [H, V, A] = [{x.shape[1]}, {BLOCK}, {x.shape[2]}], got {w.dtype} "
            f"{list(w.shape)}"
        )
    elif w.shape[1] != BLOCK or x.shape[2] % BLOCK_A:
        problems.append(
            f"V must be {BLOCK} (a head's values are one scale group) and A a multiple of "
            f"{BLOCK_A}, got V = {w.shape[1]}, A = {x.shape[2]}"
        )
    if problems:
        raise ValueError("head_products_quantize: " + "; ".join(problems))
    t, heads, latent = x.shape
    values = torch.empty(t, heads * BLOCK, dtype=x.dtype, device=x.device)
    codes = torch.empty(t, heads * BLOCK, dtype=torch.uint8, device=x.device)
    scales = empty_scales(t, heads, x.device, token_major_scales)
    if t:
        prepare_launch()
        if x.stride(2) != 1:
            x = x.contiguous()
        if w.stride(2) != 1:
            w = w.contiguous()
        block_t = 64 if t > 32 else 16  # the dot's least M is 16
        _head_quantize_kernel[(triton.cdiv(t, block_t), heads)](
            x, w, values, codes, scales, t, heads, x.stride(0), x.stride(1), w.stride(0),
            w.stride(1), scales.stride(0), scales.stride(1), A=latent, V=BLOCK, BLOCK_T=block_t,
            BLOCK_A=BLOCK_A, UE8M0=ue8m0, WIDE=wide_dtype(), num_warps=8,
            **pdl_options(x.device),
        )  # fmt: skip
    return values, (codes, scales)
