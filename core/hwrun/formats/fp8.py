"""FP8 E4M3 (OCP "e4m3fn": no inf, 0x7F/0xFF = NaN, max 448) and its scaled layouts.

Element rule: round to nearest, ties to even; finite overflow and +/-inf saturate to +/-448
(CUDA's ``__NV_SATFINITE``, torch >= 2.12's eager cast); NaN encodes to 0x7F whatever its sign.

Scaled layouts share one scale rule (docs/formats.md, "FP8 scales"): per group,
``scale = max(amax, 1e-4) / 448`` in fp32, or with ``ue8m0=True`` that value rounded up to a
power of two exactly (``2^ceil(log2(.))`` computed on the bits, so it never lands below the
fp32 value); elements are ``e4m3(x / scale)``, decoded as ``e4m3 * scale``. A NaN anywhere in a
group makes its scale NaN and the whole group decodes to NaN.
"""

from __future__ import annotations

import torch

from hwrun.formats.arith import canonical_nan, divide
from hwrun.formats.checks import (
    require_float,
    require_last_dim_multiple,
    require_shape,
    require_uint8,
)

E4M3_MAX = 448.0
E4M3_NAN = 0x7F
AMAX_FLOOR = 1e-4
BLOCK = 128


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:  # [...] float -> [...] uint8
    """E4M3 codes: round-to-nearest-even, saturating to +/-448, NaN -> 0x7F."""
    x = require_float(x, "encode_e4m3", "[...]")
    # Clamping first makes the saturation independent of the torch version's cast rule.
    codes = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(x), torch.full_like(codes, E4M3_NAN), codes)


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:  # [...] uint8 -> [...] float32
    codes = require_uint8(codes, "decode_e4m3", "[...]")
    return codes.view(torch.float8_e4m3fn).to(torch.float32)


def ceil_pow2(s: torch.Tensor) -> torch.Tensor:  # [...] fp32 > 0 -> [...] fp32
    """The smallest power of two >= s, exactly (positive normal fp32 inputs; NaN stays NaN)."""
    bits = s.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    rounded_up = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(torch.isnan(s), s, (rounded_up << 23).view(torch.float32))


def scale_from_amax(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:  # [...] -> [...] fp32
    """The fp8 scale of a group from its absolute maximum (the module docstring's rule)."""
    # clamp keeps NaN (torch.clamp propagates it), so a NaN group keeps a NaN scale.
    scale = divide(amax.float().clamp(min=AMAX_FLOOR), E4M3_MAX)
    return canonical_nan(ceil_pow2(scale) if ue8m0 else scale)


def quantize_fp8_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp32 scale for the whole tensor: returns (codes [...] uint8, scale 0-dim fp32)."""
    xf = require_float(x, "quantize_fp8_per_tensor", "[...] (non-empty)")
    if xf.numel() == 0:
        raise ValueError(
            "quantize_fp8_per_tensor: expected a non-empty tensor [...], got shape "
            f"{tuple(x.shape)}"
        )
    scale = scale_from_amax(xf.abs().amax(), ue8m0=False)
    return encode_e4m3(xf / scale), scale


def dequantize_fp8_per_tensor(codes: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    return decode_e4m3(codes) * torch.as_tensor(scale, dtype=torch.float32, device=codes.device)


def quantize_fp8_groups(
    x: torch.Tensor,  # [..., N] float, N a multiple of group
    group: int = BLOCK,
    ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # codes [..., N] uint8, scales [..., N // group] fp32
    """Per-token groups along the last dimension (activations, indexer q/k: group 128)."""
    if group <= 0:
        raise ValueError(f"quantize_fp8_groups: group must be a positive size, got {group}")
    shape = f"[..., N] with N a multiple of {group}"
    xf = require_float(x, "quantize_fp8_groups", shape)
    n = require_last_dim_multiple(xf, group, "quantize_fp8_groups", shape)
    grouped = xf.reshape(*xf.shape[:-1], n // group, group)
    scales = scale_from_amax(grouped.abs().amax(dim=-1), ue8m0)
    codes = encode_e4m3(grouped / scales.unsqueeze(-1))
    return codes.reshape(xf.shape), scales


def dequantize_fp8_groups(
    codes: torch.Tensor,  # [..., N] uint8
    scales: torch.Tensor,  # [..., N // group] fp32
    group: int = BLOCK,
) -> torch.Tensor:  # [..., N] float32
    shape = f"[..., N] with N a multiple of {group}"
    codes = require_uint8(codes, "dequantize_fp8_groups", shape)
    n = require_last_dim_multiple(codes, group, "dequantize_fp8_groups", shape)
    expected = (*codes.shape[:-1], n // group)
    require_shape(scales, expected, "dequantize_fp8_groups scales", f"{list(expected)} fp32")
    values = decode_e4m3(codes).reshape(*codes.shape[:-1], n // group, group)
    return (values * scales.float().unsqueeze(-1)).reshape(codes.shape)


def _tiles(w: torch.Tensor) -> torch.Tensor:  # [R, C] -> [ceil(R/128), 128, ceil(C/128), 128]
    """Zero-pad to whole 128x128 tiles (padding never raises a tile's amax) and expose them."""
    rows, cols = w.shape
    pad_r, pad_c = -rows % BLOCK, -cols % BLOCK
    padded = torch.nn.functional.pad(w, (0, pad_c, 0, pad_r))
    return padded.reshape((rows + pad_r) // BLOCK, BLOCK, (cols + pad_c) // BLOCK, BLOCK)


def quantize_fp8_block128(
    w: torch.Tensor,  # [R, C] float
    ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # codes [R, C] uint8, scales [ceil(R/128), ceil(C/128)]
    """Weights: one scale per 128x128 tile (DeepSeek-V3 checkpoints); edge tiles are partial."""
    wf = require_float(w, "quantize_fp8_block128", "[R, C]")
    if wf.dim() != 2 or wf.numel() == 0:
        raise ValueError(f"quantize_fp8_block128: expected shape [R, C], got {tuple(w.shape)}")
    tiles = _tiles(wf)
    scales = scale_from_amax(tiles.abs().amax(dim=(1, 3)), ue8m0)
    codes = encode_e4m3(tiles / scales[:, None, :, None])
    rows, cols = wf.shape
    return codes.reshape(tiles.shape[0] * BLOCK, -1)[:rows, :cols].contiguous(), scales


def dequantize_fp8_block128(
    codes: torch.Tensor,  # [R, C] uint8
    scales: torch.Tensor,  # [ceil(R/128), ceil(C/128)] fp32
) -> torch.Tensor:  # [R, C] float32
    codes = require_uint8(codes, "dequantize_fp8_block128", "[R, C]")
    if codes.dim() != 2:
        raise ValueError(
            f"dequantize_fp8_block128: expected shape [R, C], got {tuple(codes.shape)}"
        )
    rows, cols = codes.shape
    expected = (-(-rows // BLOCK), -(-cols // BLOCK))
    require_shape(scales, expected, "dequantize_fp8_block128 scales", f"{list(expected)} fp32")
    full = scales.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return decode_e4m3(codes) * full[:rows, :cols]
