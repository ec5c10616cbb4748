"""E8M0 scales (OCP MX v1.0): an 8-bit biased exponent, value 2^(code - 127), 0xFF = NaN.

Code 0 is 2^-127 (an fp32 subnormal), code 254 is 2^127. There is no zero and no sign.
Rule for values that are not powers of two: ``encode_e8m0`` refuses them (the callers compute
the exponent with their own rounding rule, FLOOR or RCEIL, and pass a power of two). Zero and
values below 2^-127 encode to 0x00 (torch's float8_e8m0fnu cast and the PTX
``cvt.rp.satfinite.ue8m0x2.f32`` do the same; ml_dtypes turns zero into NaN instead), NaN and
+inf encode to 0xFF.
"""

from __future__ import annotations

import torch

from hwrun.formats.checks import require_float, require_uint8

E8M0_BIAS = 127
E8M0_NAN = 0xFF
_FP32_MANTISSA_BITS = 23
_MIN_SCALE = 2.0**-127


def encode_e8m0(pow2_scales: torch.Tensor) -> torch.Tensor:  # [...] fp32 -> [...] uint8
    """Exact E8M0 codes of positive powers of two; zero and tiny values give 0x00, NaN/inf 0xFF.

    Raises ValueError for negative values and for finite values >= 2^-127 that are not powers
    of two (round them first: see mxfp4's FLOOR and RCEIL rules).
    """
    s = require_float(pow2_scales, "encode_e8m0", "[...] of powers of two")
    bits = s.view(torch.int32)
    field = (bits >> _FP32_MANTISSA_BITS) & 0xFF
    mantissa = bits & 0x7FFFFF
    tiny = s < _MIN_SCALE
    normal_pow2 = (field > 0) & (mantissa == 0)
    bad = (s < 0) | (torch.isfinite(s) & ~tiny & ~normal_pow2 & (s != _MIN_SCALE))
    if bool(bad.any()):
        first = s[bad].flatten()[0].item()
        raise ValueError(
            f"encode_e8m0: expected non-negative powers of two, got {first!r}; "
            "round the scale to a power of two first (FLOOR or RCEIL)"
        )
    # The exponent field is the code: 2^-127 and smaller have field 0, NaN and +inf field 255.
    return field.to(torch.uint8)


def decode_e8m0(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] fp32
    """2^(code - 127) as float32; 0xFF decodes to NaN, 0x00 to 2^-127."""
    codes = require_uint8(codes, "decode_e8m0", "[...]")
    field = codes.to(torch.int32)
    values = (field << _FP32_MANTISSA_BITS).view(torch.float32)
    values = torch.where(field == 0, torch.full_like(values, _MIN_SCALE), values)
    return torch.where(field == E8M0_NAN, torch.full_like(values, float("nan")), values)


def pow2_reciprocal(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] fp32
    """1 / 2^(code - 127) exactly (a power of two from 2^127 down to 2^-127), NaN for 0xFF.

    Multiplying by it is bit-identical to dividing by the scale, and cheaper.
    """
    field = codes.to(torch.int32)
    inv_field = 254 - field  # exponent field of 2^(127 - e)
    values = (inv_field.clamp(min=0) << _FP32_MANTISSA_BITS).view(torch.float32)
    values = torch.where(inv_field <= 0, torch.full_like(values, _MIN_SCALE), values)
    return torch.where(field == E8M0_NAN, torch.full_like(values, float("nan")), values)
