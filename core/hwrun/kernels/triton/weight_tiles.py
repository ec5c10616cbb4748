"""Quantized weight tiles inside the GEMM kernels (``moe.experts``, ``dense.linear``).

A K step of these kernels never crosses a 128-wide scale tile or int4 group, so it can feed the
matrix units the stored codes, exact in bf16, and scale the step's partial product afterwards:

- :func:`weight_tile`: a ``[BLOCK_N, BLOCK_K]`` tile of a bf16, ``fp8_block128`` or
  ``fp8_block128_ue8m0`` weight in the compute dtype, with its rows' scales for the step (ue8m0
  codes decode to ``2^(code - 127)``);
- :func:`int4_product`: one K step of ``int4_g128`` (W4A16) scaled: the activations' even
  columns against the packed bytes' low nibbles plus the odd columns against the high nibbles
  (two K/2 products: each weight byte read once, two integer operations per nibble).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hwrun.formats.int4 import INT4_OFFSET

# Formats the kernels decode, and the code each kernel's FORMAT constexpr takes for them.
WEIGHT_FORMATS = ("bf16", "fp8_block128", "fp8_block128_ue8m0", "int4_g128")
FORMAT_CODES = {"bf16": 0, "fp8_block128": 1, "fp8_block128_ue8m0": 2, "int4_g128": 3}
_INT4_OFFSET = tl.constexpr(INT4_OFFSET)  # an int4_g128 nibble stores q + 8


@triton.jit
def weight_tile(
    w_base,  # this expert's weight
    s_base,  # this expert's scales (fp8)
    n,  # [BLOCK_N] output rows of the weight
    n_mask,
    k0,
    kk,  # [BLOCK_K] reduction positions
    k_mask,
    stride_wn,
    stride_sn,
    FORMAT: tl.constexpr,
    WIDE: tl.constexpr,
):
    """The [BLOCK_N, BLOCK_K] tile of a bf16 or block-FP8 weight in WIDE, and its rows' scales
    [BLOCK_N] for the 128 columns this K step lies in (1 for bf16). int4 weights take
    :func:`int4_product` instead."""
    raw = tl.load(
        w_base + n[:, None] * stride_wn + kk[None, :],
        mask=n_mask[:, None] & k_mask[None, :],
        other=0,
    )
    # One return for every FORMAT: the compiler traces the statements after a constexpr
    # branch's return too.
    if FORMAT == 0:
        tile = raw.to(WIDE)
        scale = tl.full(n.shape, 1.0, tl.float32)
    else:
        tile = raw.to(tl.float8e4nv, bitcast=True).to(WIDE)
        scale = weight_scales(s_base, n, n_mask, k0, stride_sn, FORMAT)
    return tile, scale


@triton.jit
def weight_scales(s_base, n, n_mask, k0, stride_sn, FORMAT: tl.constexpr):
    """The fp32 scales [BLOCK_N] of a block-FP8 weight's rows ``n`` for the 128 columns K step
    ``k0`` lies in (FORMAT 1: fp32 scales; 2: ue8m0 codes)."""
    scale_ptrs = s_base + (n // 128) * stride_sn + k0 // 128
    if FORMAT == 1:
        scale = tl.load(scale_ptrs, mask=n_mask, other=0.0)
    else:  # ue8m0 codes: 2^(code - 127), code 0 is 2^-127
        field = tl.load(scale_ptrs, mask=n_mask, other=127).to(tl.int32)
        power = (field << 23).to(tl.float32, bitcast=True)
        scale = tl.where(field == 0, 5.877471754111438e-39, power)
    return scale


@triton.jit
def weight_scale_of_rows(s_base, row_block, k0, live, stride_sn, FORMAT: tl.constexpr):
    """What :func:`weight_scales` gives every row of scale row ``row_block`` (the 128 weight rows
    ``row_block * 128 ...``) for K step ``k0``, as one scalar load: a tile of at most 128 rows,
    aligned to them, has one scale a step. 0 where not ``live``."""
    ptr = s_base + row_block * stride_sn + k0 // 128
    if FORMAT == 1:
        scale = tl.load(ptr, mask=live, other=0.0)
    else:  # ue8m0 codes, as weight_scales decodes them
        field = tl.load(ptr, mask=live, other=127).to(tl.int32)
        power = (field << 23).to(tl.float32, bitcast=True)
        scale = tl.where(field == 0, 5.877471754111438e-39, power)
    return scale


@triton.jit
def int4_product(
    a_rows,  # [BLOCK_M] pointers to the activation rows
    a_valid,  # [BLOCK_M]
    w_base,
    s_base,
    n,
    n_mask,
    k0,
    K,
    stride_wn,
    stride_sn,
    WIDE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One K step of W4A16, scaled: the activations' even columns against the packed bytes'
    low nibbles plus the odd columns against the high nibbles. Two K/2 products instead of
    one K product over bytes read twice and shifted per column: the weight bytes are read
    once, whole, and each nibble costs two integer operations."""
    j = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # packed byte j holds columns 2j and 2j + 1
    even = 2 * j
    a_even = tl.load(
        a_rows[:, None] + even[None, :], mask=a_valid[:, None] & (even < K)[None, :], other=0
    ).to(WIDE)
    a_odd = tl.load(
        a_rows[:, None] + even[None, :] + 1,
        mask=a_valid[:, None] & (even + 1 < K)[None, :],
        other=0,
    ).to(WIDE)
    packed = tl.load(
        w_base + n[:, None] * stride_wn + j[None, :],
        mask=n_mask[:, None] & (even < K)[None, :],
        other=0,
    ).to(tl.int32)
    low = ((packed & 0xF) - _INT4_OFFSET).to(tl.float32).to(WIDE)  # -8..7: exact in bf16
    high = ((packed >> 4) - _INT4_OFFSET).to(tl.float32).to(WIDE)
    scale = tl.load(s_base + n * stride_sn + k0 // 128, mask=n_mask, other=0.0)
    product = tl.dot(a_even, tl.trans(low)) + tl.dot(a_odd, tl.trans(high))
    return product * scale[None, :]
