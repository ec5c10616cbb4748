"""FP8 E4M3 FNUZ (``float8_e4m3fnuz``): the fp8 that AMD's gfx942 (CDNA3, MI300) computes with.

Against OCP e4m3fn (:mod:`hwrun.formats.fp8`): exponent bias 8 instead of 7, so every code
means half the e4m3fn value of the same bits; no negative zero; one NaN, 0x80 (e4m3fn's -0);
no inf; largest finite value 240 (0x7F), where e4m3fn has 448 (0x7E) and NaN at 0x7F / 0xFF.

Element rule (hwrun's choice, as for e4m3fn): round to nearest, ties to even; finite overflow
and +/-inf saturate to +/-240 (ml_dtypes and torch's cast turn overflow into NaN; HIP's
``__HIP_SATFINITE`` conversions clamp, and a scaled quantizer never overflows); NaN encodes to 0x80
whatever its sign; a value that rounds to zero from below encodes to 0x00 (there is no -0).
Byte-exact against ml_dtypes ``float8_e4m3fnuz`` on every finite value within range.

:func:`fnuz_from_e4m3fn` is the boundary conversion a gfx942 adapter applies to hwrun's stored
e4m3fn codes: the FNUZ code of half the value, which is the same bits (exact, no rounding)
except -0 (0x80 -> 0x00) and NaN (0x7F, 0xFF -> 0x80). The caller doubles the scale that goes
with the codes (AITER's fp8 MQA logits do the same for its own inputs on gfx942).
"""

from __future__ import annotations

import torch

from hwrun.formats.checks import require_float, require_uint8

E4M3FNUZ_MAX = 240.0
E4M3FNUZ_NAN = 0x80
E4M3FN_NAN_BITS = 0x7F  # e4m3fn NaN: the low seven bits all set, either sign


def encode_e4m3fnuz(x: torch.Tensor) -> torch.Tensor:  # [...] float -> [...] uint8
    """FNUZ codes: round-to-nearest-even, saturating to +/-240, NaN -> 0x80, never -0."""
    x = require_float(x, "encode_e4m3fnuz", "[...]")
    # Clamping first makes the saturation independent of the torch version's cast rule.
    codes = x.clamp(-E4M3FNUZ_MAX, E4M3FNUZ_MAX).to(torch.float8_e4m3fnuz).view(torch.uint8)
    codes = torch.where(codes == E4M3FNUZ_NAN, torch.zeros_like(codes), codes)  # a rounded -0
    return torch.where(torch.isnan(x), torch.full_like(codes, E4M3FNUZ_NAN), codes)


def decode_e4m3fnuz(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] float32
    codes = require_uint8(codes, "decode_e4m3fnuz", "[...]")
    return codes.view(torch.float8_e4m3fnuz).to(torch.float32)


def fnuz_from_e4m3fn(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] uint8
    """The FNUZ codes of half the values of e4m3fn ``codes``, exactly (see the module doc)."""
    codes = require_uint8(codes, "fnuz_from_e4m3fn", "[...]")
    nan = (codes & E4M3FN_NAN_BITS) == E4M3FN_NAN_BITS
    out = torch.where(codes == 0x80, torch.zeros_like(codes), codes)
    return torch.where(nan, torch.full_like(codes, E4M3FNUZ_NAN), out)
