"""MXFP4 (OCP MX v1.0): E2M1 elements (see e2m1.py), one E8M0 scale per 32, two elements a byte.

Scale rules (the exponent e of the block scale 2^e, stored as E8M0 code e + 127):
- ``"floor"`` (default, OCP v1.0 and torchao's FLOOR): ``e = floor(log2(amax)) - 2`` read from
  the exponent bits of amax, clamped to [-127, 128] (amax zero or subnormal: e = -127); amax
  NaN -> 0xFF. Elements may saturate at 6 (amax up to 7.99 * 2^e).
- ``"rceil"`` (cuBLAS / FlashInfer / TransformerEngine, PTX ``cvt.rp.satfinite.ue8m0``):
  ``e = ceil(log2(amax / 6))`` exactly on the bits of the fp32 quotient, clamped to
  [-127, 127]; amax zero -> 0x00, +inf -> 0xFE, NaN -> 0xFF. Elements never saturate.
Elements are ``e2m1(x * 2^-e)`` with the exact power of two (also 2^127 for code 0); every
element of a NaN block (scale 0xFF) is code 0. A block holding +/-inf gets 0xFD under
``"floor"`` (inf's exponent bits read as 128, as torchao; OCP's reference code gives NaN) and
0xFE under ``"rceil"``: the infinity saturates to 6 * 2^126, its finite neighbours decode to 0.
"""

from __future__ import annotations

import torch

from hwrun.formats.arith import divide
from hwrun.formats.checks import require_float, require_last_dim_multiple, require_uint8
from hwrun.formats.e2m1 import (
    CHUNK_ELEMENTS,
    E2M1_MAGNITUDES,
    E2M1_MAX,
    decode_e2m1,
    decode_packed_e2m1,
    encode_e2m1,
    encode_scaled_blocks,
    pack_nibbles,
    unpack_nibbles,
)
from hwrun.formats.e8m0 import E8M0_BIAS, E8M0_NAN, decode_e8m0, pow2_reciprocal

__all__ = [
    "E2M1_MAGNITUDES",
    "E2M1_MAX",
    "MX_BLOCK",
    "SCALE_RULES",
    "decode_e2m1",
    "dequantize_mxfp4",
    "encode_e2m1",
    "mx_scale",
    "mx_scale_codes",
    "pack_nibbles",
    "quantize_mxfp4",
    "unpack_nibbles",
]

MX_BLOCK = 32
_E2M1_MAX_EXP = 2  # floor(log2(6))
SCALE_RULES = ("floor", "rceil")
_BLOCKS_PER_CHUNK = CHUNK_ELEMENTS // MX_BLOCK


def mx_scale_codes(amax: torch.Tensor, rule: str) -> torch.Tensor:  # [...] fp32 -> [...] uint8
    """E8M0 scale code of a block from its absolute maximum (FLOOR or RCEIL, see above)."""
    amax = amax.float()
    if rule == "floor":
        field = (amax.view(torch.int32) >> 23) & 0xFF  # floor(log2) + 127; 0 for zero/subnormal
        codes = (field - _E2M1_MAX_EXP).clamp(0, E8M0_NAN)
    elif rule == "rceil":
        mantissa, exponent = torch.frexp(divide(amax, E2M1_MAX))  # q = m * 2^x, m in [0.5, 1)
        e = exponent.to(torch.int32) - (mantissa == 0.5).to(torch.int32)  # ceil(log2(q))
        codes = (e + E8M0_BIAS).clamp(0, 254)
        codes = torch.where(amax == 0, torch.zeros_like(codes), codes)
        codes = torch.where(torch.isinf(amax), torch.full_like(codes, 254), codes)
    else:
        raise ValueError(f"mx scale rule {rule!r} is not one of {SCALE_RULES}")
    return torch.where(torch.isnan(amax), torch.full_like(codes, E8M0_NAN), codes).to(torch.uint8)


def mx_scale(amax: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E8M0 scale codes, exact reciprocal multipliers) of blocks with absolute maxima amax."""
    codes = mx_scale_codes(amax, rule)
    return codes, pow2_reciprocal(codes)


def quantize_mxfp4(
    x: torch.Tensor,  # [..., N] float, N a multiple of 32
    rule: str = "floor",
) -> tuple[torch.Tensor, torch.Tensor]:  # packed [..., N // 2] uint8, scales [..., N // 32] e8m0
    shape = "[..., N] with N a multiple of 32"
    if rule not in SCALE_RULES:
        raise ValueError(f"quantize_mxfp4: rule {rule!r} is not one of {SCALE_RULES}")
    xf = require_float(x, "quantize_mxfp4", shape)
    n = require_last_dim_multiple(xf, MX_BLOCK, "quantize_mxfp4", shape)
    packed, scales = encode_scaled_blocks(xf.reshape(-1, MX_BLOCK), lambda a: mx_scale(a, rule))
    lead = xf.shape[:-1]
    return packed.reshape(*lead, n // 2), scales.reshape(*lead, n // MX_BLOCK)


def decode_scaled_blocks(
    packed: torch.Tensor,  # [..., N // 2] uint8
    scales: torch.Tensor,  # [..., N // 32] uint8 e8m0
) -> torch.Tensor:  # [..., N] float32
    values = decode_packed_e2m1(packed).reshape(*scales.shape, MX_BLOCK)
    return (values * decode_e8m0(scales).unsqueeze(-1)).reshape(*packed.shape[:-1], -1)


def dequantize_mxfp4(
    packed: torch.Tensor,  # [..., N // 2] uint8
    scales: torch.Tensor,  # [..., N // 32] uint8 e8m0
) -> torch.Tensor:  # [..., N] float32
    shape = "[..., N // 2] with N a multiple of 32"
    packed = require_uint8(packed, "dequantize_mxfp4", shape)
    half = require_last_dim_multiple(packed, MX_BLOCK // 2, "dequantize_mxfp4", shape)
    scales = require_uint8(scales, "dequantize_mxfp4 scales", "[..., N // 32] e8m0")
    expected = (*packed.shape[:-1], half * 2 // MX_BLOCK)
    if tuple(scales.shape) != expected:
        raise ValueError(
            f"dequantize_mxfp4 scales: expected shape {list(expected)} uint8, got "
            f"{tuple(scales.shape)}"
        )
    flat_packed, flat_scales = packed.reshape(-1, MX_BLOCK // 2), scales.reshape(-1)
    out = torch.empty((flat_scales.numel(), MX_BLOCK), dtype=torch.float32, device=packed.device)
    for start in range(0, flat_scales.numel(), _BLOCKS_PER_CHUNK):
        stop = start + _BLOCKS_PER_CHUNK
        out[start:stop] = decode_scaled_blocks(flat_packed[start:stop], flat_scales[start:stop])
    return out.reshape(*packed.shape[:-1], half * 2)
