"""E2M1 (FP4) elements, shared by mxfp4, nvfp4, the nvfp4 latent rows and mxfp4 index keys.

Rule: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, code = sign << 3 | magnitude index; round to
nearest, ties to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
5 -> 4); beyond 6 and +/-inf saturate to +/-6; the sign is kept (-0.1 -> 0x8, as ml_dtypes);
NaN -> 0x0. Two codes share a byte: element 2i in the low nibble of byte i.

The encoder is arithmetic rather than a table search (a binary search per element is the slow
part on CPUs): ``a + C - C`` with ``C = max(2^22, 2^(floor(log2 a) + 22))`` rounds ``a`` to the
E2M1 grid of its binade in one fp32 addition (the grid step there is ``C * 2^-23``, and fp32's
round-half-even lands exactly on E2M1's even codes); ``min(2v, v + 2, v / 2 + 4, 7)`` then maps
the grid value v to its magnitude index.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwrun.formats.checks import require_float, require_uint8

E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
CHUNK_ELEMENTS = 1 << 20  # per pass: amortizes torch's per-op cost, keeps buffers cache-sized
_SATURATE_AT = 8.0  # anything >= 7 rounds to 8 and saturates to code 7 (6.0)
_TWO_POW_22_BITS = 0x4A800000
_EXPONENT_MASK = 0x7F800000


def magnitude_codes_(a: torch.Tensor) -> torch.Tensor:  # [...] fp32 >= 0 -> [...] fp32 0..7
    """Magnitude index of each non-negative ``a`` (overwritten); NaN stays NaN."""
    a.clamp_(max=_SATURATE_AT)
    magic = (a.view(torch.int32) & _EXPONENT_MASK).add_(22 << 23)
    magic = magic.clamp_(min=_TWO_POW_22_BITS).view(torch.float32)
    a.add_(magic).sub_(magic)
    code = a * 2
    torch.minimum(code, a.add(2), out=code)
    torch.minimum(code, a.mul_(0.5).add_(4), out=code)
    return code.clamp_(max=7)


def sign_bits(x: torch.Tensor) -> torch.Tensor:  # [...] fp32 -> [...] uint8 (0 or 8)
    return ((x.view(torch.int32) >> 28) & 8).to(torch.uint8)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:  # [...] float -> [...] uint8 codes 0..15
    """E2M1 codes of x (the module docstring's rule), one per byte."""
    xf = require_float(x, "encode_e2m1", "[...]").contiguous()
    flat = xf.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8, device=xf.device)
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        part = flat[start : start + CHUNK_ELEMENTS]
        codes = magnitude_codes_(part.abs()).to(torch.uint8) | sign_bits(part)
        out[start : start + CHUNK_ELEMENTS] = codes.masked_fill_(torch.isnan(part), 0)
    return out.reshape(xf.shape)


def encode_scaled_blocks(
    blocks: torch.Tensor,  # [B, k] fp32, k even
    scale_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:  # packed [B, k // 2] uint8, scales [B] uint8
    """Scaled E2M1 blocks, a cache-sized chunk at a time. ``scale_of(amax [B])`` returns the
    stored scale codes and the multiplier applied to the elements before rounding. Every
    element of a block whose amax is NaN is code 0."""
    rows, k = blocks.shape
    packed = torch.empty((rows, k // 2), dtype=torch.uint8, device=blocks.device)
    scales = torch.empty(rows, dtype=torch.uint8, device=blocks.device)
    step = max(1, CHUNK_ELEMENTS // k)
    for start in range(0, rows, step):
        part = blocks[start : start + step]
        a = part.abs()
        amax = a.amax(dim=-1)
        stored, multiplier = scale_of(amax)
        a.mul_(multiplier.unsqueeze(-1))
        codes = magnitude_codes_(a).to(torch.uint8) | sign_bits(part)
        nan_blocks = torch.isnan(amax)
        if bool(nan_blocks.any()):
            codes[nan_blocks] = 0
        packed[start : start + step] = pack_nibbles(codes)
        scales[start : start + step] = stored
    return packed, scales


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] float32
    codes = require_uint8(codes, "decode_e2m1", "[...] with values 0..15")
    signed = [*E2M1_MAGNITUDES, *(-m for m in E2M1_MAGNITUDES)]
    table = torch.tensor(signed, dtype=torch.float32, device=codes.device)
    return table[(codes & 0xF).long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:  # [..., N] uint8 -> [..., N // 2]
    """Element 2i in the low nibble of byte i, element 2i + 1 in the high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:  # [..., N // 2] uint8 -> [..., N]
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def decode_packed_e2m1(packed: torch.Tensor) -> torch.Tensor:  # [..., n] uint8 -> [..., 2n] fp32
    """Both elements of each byte at once, through a 256-entry table of value pairs."""
    low = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=packed.device)
    values = torch.cat((low, -low))
    pairs = torch.stack((values.repeat(16), values.repeat_interleave(16)), dim=-1)  # [256, 2]
    return torch.nn.functional.embedding(packed.long(), pairs).reshape(*packed.shape[:-1], -1)
