"""INT4 group-128 weights for W4A16 (weights int4, activations bf16): symmetric, no zero point.

Rule: per row and per group of 128 columns, ``scale = max(amax / 7.5, FLT_MIN)`` in fp32 (the
signed range [-8, 7] spans 15 steps; GPTQ's and compressed-tensors' symmetric rule, torchao's
``MappingType.SYMMETRIC``), ``q = clamp(round_half_even(w * (1 / scale)), -8, 7)``; decoded as
``q * scale``. A group's largest positive value may clip to 7 * scale (= amax * 14/15).

Packing: the nibble stored is ``q + 8`` (unsigned "uint4b8"); byte j of a row holds column 2j
in its low nibble and column 2j + 1 in its high nibble. Read as little-endian int32 words this is
compressed-tensors' ``pack-quantized`` layout (eight columns per word, column 8k + i at bits
4i..4i+3). Weights must be finite.
"""

from __future__ import annotations

import torch

from hwrun.formats.arith import divide
from hwrun.formats.checks import (
    require_float,
    require_last_dim_multiple,
    require_shape,
    require_uint8,
)
from hwrun.formats.e2m1 import pack_nibbles, unpack_nibbles

INT4_GROUP = 128
INT4_MIN, INT4_MAX = -8, 7
INT4_OFFSET = 8
FLT_MIN = torch.finfo(torch.float32).tiny


def quantize_int4_g128(
    w: torch.Tensor,  # [R, C] float, C a multiple of 128
) -> tuple[torch.Tensor, torch.Tensor]:  # packed [R, C // 2] uint8, scales [R, C // 128] fp32
    shape = "[R, C] with C a multiple of 128"
    wf = require_float(w, "quantize_int4_g128", shape)
    cols = require_last_dim_multiple(wf, INT4_GROUP, "quantize_int4_g128", shape)
    if wf.dim() != 2:
        raise ValueError(f"quantize_int4_g128: expected shape {shape}, got {tuple(w.shape)}")
    if not bool(torch.isfinite(wf).all()):
        raise ValueError("quantize_int4_g128: weights must be finite (found NaN or inf)")
    groups = wf.reshape(wf.shape[0], cols // INT4_GROUP, INT4_GROUP)
    amax = groups.abs().amax(dim=-1)
    scales = divide(amax, (INT4_MAX - INT4_MIN) / 2).clamp(min=FLT_MIN)
    q = torch.round(groups * (1.0 / scales).unsqueeze(-1)).clamp(INT4_MIN, INT4_MAX)
    nibbles = (q.to(torch.int16) + INT4_OFFSET).to(torch.uint8).reshape(wf.shape)
    return pack_nibbles(nibbles), scales


def dequantize_int4_g128(
    packed: torch.Tensor,  # [R, C // 2] uint8
    scales: torch.Tensor,  # [R, C // 128] fp32
) -> torch.Tensor:  # [R, C] float32
    shape = "[R, C // 2] with C a multiple of 128"
    packed = require_uint8(packed, "dequantize_int4_g128", shape)
    half = require_last_dim_multiple(packed, INT4_GROUP // 2, "dequantize_int4_g128", shape)
    if packed.dim() != 2:
        raise ValueError(f"dequantize_int4_g128: expected shape {shape}, got {tuple(packed.shape)}")
    expected = (packed.shape[0], half * 2 // INT4_GROUP)
    require_shape(scales, expected, "dequantize_int4_g128 scales", f"{list(expected)} fp32")
    q = unpack_nibbles(packed).to(torch.float32) - INT4_OFFSET
    groups = q.reshape(*expected, INT4_GROUP) * scales.float().unsqueeze(-1)
    return groups.reshape(packed.shape[0], half * 2)
