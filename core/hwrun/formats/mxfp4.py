"""MXFP4 (OCP MX v1.0): E2M1 elements, one E8M0 scale per 32 elements, two elements a byte.

E2M1 rule: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, code = sign << 3 | magnitude index; round to
nearest, ties to even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
5 -> 4); beyond 6 and +/-inf saturate to +/-6; the sign is kept (-0.1 -> 0x8); NaN -> 0x0.

Scale rules (the exponent e of the block scale 2^e, stored as E8M0 code e + 127):
- ``"floor"`` (default, OCP v1.0 and torchao's FLOOR): ``e = floor(log2(amax)) - 2`` read from
  the exponent bits of amax, clamped to [-127, 128] (amax zero or subnormal: e = -127); amax
  NaN -> 0xFF. Elements may saturate at 6 (amax up to 7.99 * 2^e).
- ``"rceil"`` (cuBLAS / FlashInfer / TransformerEngine, PTX ``cvt.rp.satfinite.ue8m0``):
  ``e = ceil(log2(amax / 6))`` exactly on the bits of the fp32 quotient, clamped to
  [-127, 127]; amax zero -> 0x00, +inf -> 0xFE, NaN -> 0xFF. Elements never saturate.
Elements are ``e2m1(x * 2^-e)`` with the exact power of two (also 2^127 for code 0).
"""

from __future__ import annotations

import torch

from hwrun.formats.checks import require_float, require_last_dim_multiple, require_uint8
from hwrun.formats.e8m0 import E8M0_BIAS, E8M0_NAN, decode_e8m0, pow2_reciprocal

MX_BLOCK = 32
E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MAX_EXP = 2  # floor(log2(6))
SCALE_RULES = ("floor", "rceil")


def _below(value: float) -> float:
    return torch.nextafter(torch.tensor(value), torch.tensor(0.0)).item()


# Upper bound (inclusive) of each magnitude index's bucket: a tie at a midpoint goes to the even
# code, so midpoints whose upper neighbour is even are nudged one ulp down (the tie rounds up).
_E2M1_BOUNDS = (0.25, _below(0.75), 1.25, _below(1.75), 2.5, _below(3.5), 5.0)
_bounds_cache: dict[torch.device, torch.Tensor] = {}
_values_cache: dict[torch.device, torch.Tensor] = {}


def _bounds(device: torch.device) -> torch.Tensor:
    if device not in _bounds_cache:
        _bounds_cache[device] = torch.tensor(_E2M1_BOUNDS, dtype=torch.float32, device=device)
    return _bounds_cache[device]


def _e2m1_values(device: torch.device) -> torch.Tensor:
    if device not in _values_cache:
        signed = [*E2M1_MAGNITUDES, *(-m for m in E2M1_MAGNITUDES)]
        _values_cache[device] = torch.tensor(signed, dtype=torch.float32, device=device)
    return _values_cache[device]


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:  # [...] float -> [...] uint8 codes 0..15
    """E2M1 codes (the module docstring's rule), one per byte."""
    x = require_float(x, "encode_e2m1", "[...]")
    # bucketize counts the bounds strictly below |x|: the magnitude index. NaN -> index 7 on
    # some backends, so it is zeroed explicitly; inf lands in the last bucket (saturation).
    magnitude = torch.bucketize(x.abs(), _bounds(x.device), out_int32=True).to(torch.uint8)
    codes = magnitude | (torch.signbit(x).to(torch.uint8) << 3)
    return codes.masked_fill_(torch.isnan(x), 0)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] float32
    codes = require_uint8(codes, "decode_e2m1", "[...] with values 0..15")
    return _e2m1_values(codes.device)[(codes & 0xF).long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:  # [..., N] uint8 -> [..., N // 2]
    """Element 2i in the low nibble of byte i, element 2i + 1 in the high nibble."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:  # [..., N // 2] uint8 -> [..., N]
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def mx_scale_codes(amax: torch.Tensor, rule: str) -> torch.Tensor:  # [...] fp32 -> [...] uint8
    """E8M0 scale code of a block from its absolute maximum (FLOOR or RCEIL, see above)."""
    amax = amax.float()
    if rule == "floor":
        field = (amax.view(torch.int32) >> 23) & 0xFF  # floor(log2) + 127; 0 for zero/subnormal
        codes = (field - _E2M1_MAX_EXP).clamp(0, E8M0_NAN)
    elif rule == "rceil":
        mantissa, exponent = torch.frexp(amax / E2M1_MAX)  # q = m * 2^x, m in [0.5, 1)
        e = exponent.to(torch.int32) - (mantissa == 0.5).to(torch.int32)  # ceil(log2(q))
        codes = (e + E8M0_BIAS).clamp(0, 254)
        codes = torch.where(amax == 0, torch.zeros_like(codes), codes)
        codes = torch.where(torch.isinf(amax), torch.full_like(codes, 254), codes)
    else:
        raise ValueError(f"mx scale rule {rule!r} is not one of {SCALE_RULES}")
    return torch.where(torch.isnan(amax), torch.full_like(codes, E8M0_NAN), codes).to(torch.uint8)


def quantize_mxfp4(
    x: torch.Tensor,  # [..., N] float, N a multiple of 32
    rule: str = "floor",
) -> tuple[torch.Tensor, torch.Tensor]:  # packed [..., N // 2] uint8, scales [..., N // 32] e8m0
    shape = "[..., N] with N a multiple of 32"
    if rule not in SCALE_RULES:
        raise ValueError(f"quantize_mxfp4: rule {rule!r} is not one of {SCALE_RULES}")
    xf = require_float(x, "quantize_mxfp4", shape)
    n = require_last_dim_multiple(xf, MX_BLOCK, "quantize_mxfp4", shape)
    blocks = xf.reshape(*xf.shape[:-1], n // MX_BLOCK, MX_BLOCK)
    scales = mx_scale_codes(blocks.abs().amax(dim=-1), rule)
    codes = encode_e2m1(blocks * pow2_reciprocal(scales).unsqueeze(-1))
    return pack_nibbles(codes.reshape(xf.shape)), scales


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
    values = decode_e2m1(unpack_nibbles(packed)).reshape(*expected, MX_BLOCK)
    return (values * decode_e8m0(scales).unsqueeze(-1)).reshape(*packed.shape[:-1], half * 2)
