"""NVFP4: E2M1 elements, one E4M3 scale per 16 elements, and one fp32 tensor scale.

Rule (docs/formats.md, "NVFP4"): ``tensor_scale = min(448 * 6 / amax(x), FLT_MAX * 2^-9)``
unless given, with ``amax`` over the finite elements only (1.0 when that is 0): a NaN or an
infinity costs its own block, never the tensor, and a tiny tensor keeps a finite scale; per
block of 16, ``sf = (amax_b / 6) * tensor_scale`` in fp32, stored as
``s = e4m3(max(sf, 2^-9))`` (RNE, saturating at 448; the floor at the smallest e4m3 keeps every
scale non-zero, as DeepSeek-V4's fp4 activation quantizer does); elements
``e2m1(x * (tensor_scale / s))`` with E2M1's element rule (e2m1.py). Decoding is
``e2m1 * s / tensor_scale``. The arithmetic order is torchao's ``nvfp4_quantize`` (with its
``per_tensor_scale`` = 1 / tensor_scale); torchao floors ``sf`` at 2^-6 instead of 2^-9.

Scale layouts: ``quantize_nvfp4`` returns scales linear ``[..., N // 16]``;
``swizzle_128x4`` / ``unswizzle_128x4`` convert a ``[M, N // 16]`` matrix to and from the
128x4-tiled layout the Blackwell block-scaled MMA reads (cuBLAS "block scaling factors
layout"): rows and columns zero-padded to multiples of 128 and 4, tiles in row-major order, and
inside a 512-byte tile the scale of row r, column c at ``(r % 32) * 16 + (r // 32) * 4 + c``.
"""

from __future__ import annotations

import torch

from hwrun.formats.arith import divide, divide_into
from hwrun.formats.checks import (
    require_float,
    require_last_dim_multiple,
    require_shape,
    require_uint8,
)
from hwrun.formats.e2m1 import (
    E2M1_MAX,
    decode_packed_e2m1,
    encode_scaled_blocks,
)
from hwrun.formats.fp8 import E4M3_MAX, decode_e4m3, encode_e4m3

NV_BLOCK = 16
MIN_BLOCK_SCALE = 2.0**-9  # the smallest positive e4m3 (a subnormal)
TILE_ROWS, TILE_COLS = 128, 4
MAX_TENSOR_SCALE = torch.finfo(torch.float32).max * MIN_BLOCK_SCALE  # 2^119 (1 - 2^-24)


def default_tensor_scale(x: torch.Tensor) -> torch.Tensor:  # [...] -> 0-dim fp32
    magnitude = x.float().abs()
    amax = torch.where(torch.isfinite(magnitude), magnitude, 0.0).amax()
    # Capped so that tensor_scale / s stays finite for every block scale s >= 2^-9 (the quotient
    # overflowed fp32 below amax ~7.9e-36 and the tensor decoded to zeros).
    scale = divide_into(E4M3_MAX * E2M1_MAX, amax).clamp(max=MAX_TENSOR_SCALE)
    return torch.where(amax == 0, torch.ones_like(amax), scale)


def quantize_blocks(
    x: torch.Tensor,  # [..., N] fp32, N a multiple of 16
    tensor_scale: torch.Tensor,  # 0-dim fp32
) -> tuple[torch.Tensor, torch.Tensor]:  # packed [..., N // 2] uint8, scales [..., N // 16] e4m3
    """The NVFP4 block step (module docstring), shared with the nvfp4_ds_mla latent rows."""

    def scale_of(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sf = divide(amax, E2M1_MAX) * tensor_scale
        scales = encode_e4m3(sf.clamp(min=MIN_BLOCK_SCALE))
        return scales, tensor_scale / decode_e4m3(scales)

    packed, scales = encode_scaled_blocks(x.reshape(-1, NV_BLOCK), scale_of)
    lead = x.shape[:-1]
    return packed.reshape(*lead, x.shape[-1] // 2), scales.reshape(*lead, -1)


def dequantize_blocks(
    packed: torch.Tensor,  # [..., N // 2] uint8
    scales: torch.Tensor,  # [..., N // 16] uint8 e4m3
) -> torch.Tensor:  # [..., N] float32, before the tensor scale
    values = decode_packed_e2m1(packed).reshape(*scales.shape, NV_BLOCK)
    return (values * decode_e4m3(scales).unsqueeze(-1)).reshape(*packed.shape[:-1], -1)


def quantize_nvfp4(
    x: torch.Tensor,  # [..., N] float, N a multiple of 16
    tensor_scale: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (packed [..., N // 2] uint8, scales [..., N // 16] uint8 e4m3, tensor_scale)."""
    shape = "[..., N] with N a multiple of 16"
    xf = require_float(x, "quantize_nvfp4", shape)
    require_last_dim_multiple(xf, NV_BLOCK, "quantize_nvfp4", shape)
    if tensor_scale is None:
        ts = default_tensor_scale(xf)
    else:
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=xf.device).reshape(())
    packed, scales = quantize_blocks(xf, ts)
    return packed, scales, ts


def dequantize_nvfp4(
    packed: torch.Tensor,  # [..., N // 2] uint8
    scales: torch.Tensor,  # [..., N // 16] uint8 e4m3
    tensor_scale: torch.Tensor | float,
) -> torch.Tensor:  # [..., N] float32
    shape = "[..., N // 2] with N a multiple of 16"
    packed = require_uint8(packed, "dequantize_nvfp4", shape)
    half = require_last_dim_multiple(packed, NV_BLOCK // 2, "dequantize_nvfp4", shape)
    scales = require_uint8(scales, "dequantize_nvfp4 scales", "[..., N // 16] e4m3")
    expected = (*packed.shape[:-1], half * 2 // NV_BLOCK)
    require_shape(scales, expected, "dequantize_nvfp4 scales", f"{list(expected)} uint8")
    ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=packed.device)
    return dequantize_blocks(packed, scales) / ts


def _tiled_offsets(rows: int, cols: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Offset of each [rows, cols] scale in the 128x4-tiled buffer, and the buffer size."""
    col_tiles = -(-cols // TILE_COLS)
    r = torch.arange(rows, device=device).unsqueeze(1)
    c = torch.arange(cols, device=device).unsqueeze(0)
    tile = (r // TILE_ROWS) * col_tiles + c // TILE_COLS
    inner = (r % 32) * 16 + ((r % TILE_ROWS) // 32) * 4 + c % TILE_COLS
    padded_rows = -(-rows // TILE_ROWS) * TILE_ROWS
    return tile * (TILE_ROWS * TILE_COLS) + inner, padded_rows * col_tiles * TILE_COLS


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:  # [M, K] uint8 -> flat uint8
    """Linear ``[M, K]`` scales (K = N // 16) to the 128x4-tiled layout, zero padded."""
    scales = require_uint8(scales, "swizzle_128x4", "[M, K]")
    if scales.dim() != 2:
        raise ValueError(f"swizzle_128x4: expected shape [M, K], got {tuple(scales.shape)}")
    offsets, size = _tiled_offsets(*scales.shape, scales.device)
    out = torch.zeros(size, dtype=torch.uint8, device=scales.device)
    out[offsets.flatten()] = scales.flatten()
    return out


def unswizzle_128x4(tiled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:  # -> [M, K]
    tiled = require_uint8(tiled, "unswizzle_128x4", "[ceil(M/128)*128 * ceil(K/4)*4] flat")
    offsets, size = _tiled_offsets(rows, cols, tiled.device)
    if tiled.dim() != 1 or tiled.numel() != size:
        raise ValueError(
            f"unswizzle_128x4: expected shape [{size}] for a [{rows}, {cols}] "
            f"scale matrix, got {tuple(tiled.shape)}"
        )
    return tiled[offsets]
