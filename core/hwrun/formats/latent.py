"""KV latent rows: one token of one MLA layer (512 NoPE latent + 64 RoPE dims = 576 values).

Every row is self-contained (its scales travel with it), so a row written by one vendor's
kernel decodes to the same numbers under any other. Byte layouts (docs/formats.md has tables):

- ``bf16`` (1152 B): the 576 values as little-endian bf16 (RNE from fp32).
- ``fp8_e4m3`` (576 B): the 576 values as ``e4m3(x / scale)`` with one per-tensor ``scale``
  (default 1.0, vLLM's ``k_scale``) applied to NoPE and RoPE alike; decodes to ``e4m3 * scale``.
- ``fp8_ds_mla`` (656 B, vLLM ``fp8_ds_mla`` / FlashMLA "V32_FP8Sparse"): bytes [0, 512) the
  NoPE as e4m3, [512, 528) four little-endian fp32 scales (one per 128 NoPE values), [528, 656)
  the RoPE as bf16. Encoding is vLLM's ``concat_and_cache_ds_mla`` kernel:
  ``scale = max(amax / 448, FLT_MIN)`` (a raw fp32, not a power of two),
  ``e4m3(x / scale)`` saturating. Decoding is FlashMLA's sparse kernel: the scale is rounded to
  bf16 and the product ``e4m3 * bf16(scale)`` is rounded to bf16.
- ``nvfp4_ds_mla`` (352 B): [0, 256) the NoPE as packed e2m1 (element 2i in the low nibble of
  byte i), [256, 320) the RoPE as unscaled e4m3 (saturating at 448), [320, 352) 32 e4m3 scales,
  one per 16 NoPE values. The NoPE follows nvfp4's block rule with the tensor scale fixed at 1
  (no global scale: a row must not depend on per-layer state, as in FlashMLA's V4 FP4 cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hwrun.formats.arith import canonical_nan, divide
from hwrun.formats.checks import require_float, require_uint8
from hwrun.formats.fp8 import E4M3_MAX, decode_e4m3, encode_e4m3
from hwrun.formats.nvfp4 import dequantize_blocks, quantize_blocks

NOPE_DIM, ROPE_DIM = 512, 64
LATENT_DIM = NOPE_DIM + ROPE_DIM
DS_MLA_TILE = 128
FLT_MIN = torch.finfo(torch.float32).tiny


def _bytes_of(x: torch.Tensor) -> torch.Tensor:  # [..., n] any dtype -> [..., n * itemsize]
    """The little-endian bytes of x's elements (torch views are host-endian: little on every
    supported device)."""
    return x.contiguous().view(torch.uint8)


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # [..., n*size] uint8 -> [..., n]
    return raw.contiguous().view(dtype)


def _bf16_encode(nope: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    return _bytes_of(canonical_nan(torch.cat((nope, rope), dim=-1).to(torch.bfloat16)))


def _bf16_decode(rows: torch.Tensor) -> torch.Tensor:
    return _as(rows, torch.bfloat16).float()


def _fp8_encode(nope: torch.Tensor, rope: torch.Tensor, scale: float) -> torch.Tensor:
    return encode_e4m3(divide(torch.cat((nope, rope), dim=-1), scale))


def _fp8_decode(rows: torch.Tensor, scale: float) -> torch.Tensor:
    return decode_e4m3(rows) * scale


def _ds_mla_encode(nope: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    tiles = nope.reshape(*nope.shape[:-1], NOPE_DIM // DS_MLA_TILE, DS_MLA_TILE)
    scales = canonical_nan(divide(tiles.abs().amax(dim=-1), E4M3_MAX).clamp(min=FLT_MIN))
    codes = encode_e4m3(tiles / scales.unsqueeze(-1)).reshape(nope.shape)
    return torch.cat(
        (codes, _bytes_of(scales), _bytes_of(canonical_nan(rope.to(torch.bfloat16)))), dim=-1
    )


def _ds_mla_decode(rows: torch.Tensor) -> torch.Tensor:
    values = decode_e4m3(rows[..., :NOPE_DIM]).reshape(*rows.shape[:-1], -1, DS_MLA_TILE)
    scales = _as(rows[..., NOPE_DIM : NOPE_DIM + 16], torch.float32)
    bf16_scales = scales.to(torch.bfloat16).float()
    # e4m3 (4 significant bits) times a bf16 (8 bits) is exact in fp32, so one bf16 rounding of
    # the fp32 product equals the kernel's bf16 multiply.
    nope = (values * bf16_scales.unsqueeze(-1)).to(torch.bfloat16).float()
    rope = _as(rows[..., NOPE_DIM + 16 :], torch.bfloat16).float()
    return torch.cat((nope.reshape(*rows.shape[:-1], NOPE_DIM), rope), dim=-1)


def _nvfp4_encode(nope: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    packed, scales = quantize_blocks(nope, torch.tensor(1.0, device=nope.device))
    return torch.cat((packed, encode_e4m3(rope), scales), dim=-1)


def _nvfp4_decode(rows: torch.Tensor) -> torch.Tensor:
    nope = dequantize_blocks(rows[..., : NOPE_DIM // 2], rows[..., NOPE_DIM // 2 + ROPE_DIM :])
    rope = decode_e4m3(rows[..., NOPE_DIM // 2 : NOPE_DIM // 2 + ROPE_DIM])
    return torch.cat((nope, rope), dim=-1)


@dataclass(frozen=True)
class LatentFormat:
    """One latent row format: ``name``, ``row_bytes`` per token, and its codec."""

    name: str
    row_bytes: int
    summary: str
    takes_scale: bool
    _encode: Callable[..., torch.Tensor]
    _decode: Callable[..., torch.Tensor]

    def _scale(self, scale: float | None) -> tuple[float, ...]:
        if self.takes_scale:
            return (1.0 if scale is None else float(scale),)
        if scale is not None:
            raise ValueError(
                f"latent format {self.name!r} carries its scales in the row; "
                "a per-tensor scale applies to 'fp8_e4m3' only: pass scale=None"
            )
        return ()

    def encode(
        self,
        nope: torch.Tensor,  # [T, 512] float
        rope: torch.Tensor,  # [T, 64] float
        scale: float | None = None,
    ) -> torch.Tensor:  # [T, row_bytes] uint8
        nope_f = require_float(nope, f"{self.name}.encode nope", "[T, 512]")
        rope_f = require_float(rope, f"{self.name}.encode rope", "[T, 64]")
        if nope_f.shape[-1:] != (NOPE_DIM,) or rope_f.shape != (*nope_f.shape[:-1], ROPE_DIM):
            raise ValueError(
                f"{self.name}.encode: expected nope [T, 512] and rope [T, 64], got "
                f"{tuple(nope.shape)} and {tuple(rope.shape)}"
            )
        return self._encode(nope_f, rope_f, *self._scale(scale))

    def decode(
        self,
        rows: torch.Tensor,  # [T, row_bytes] uint8 (any leading dims; strided views allowed)
        scale: float | None = None,
    ) -> torch.Tensor:  # [T, 576] float32: NoPE then RoPE
        expected = f"[T, {self.row_bytes}]"
        rows = require_uint8(rows, f"{self.name}.decode", expected)
        if rows.dim() == 0 or rows.shape[-1] != self.row_bytes:
            raise ValueError(
                f"{self.name}.decode: expected rows {expected} uint8, got {tuple(rows.shape)}"
            )
        return self._decode(rows, *self._scale(scale))


LATENT_FORMATS: dict[str, LatentFormat] = {
    f.name: f
    for f in (
        LatentFormat("bf16", 1152, "576 bf16", False, _bf16_encode, _bf16_decode),
        LatentFormat("fp8_e4m3", 576, "576 e4m3, per-tensor scale", True, _fp8_encode, _fp8_decode),
        LatentFormat(
            "fp8_ds_mla",
            656,
            "512 e4m3 NoPE, 4 fp32 scales, 64 bf16 RoPE",
            False,
            _ds_mla_encode,
            _ds_mla_decode,
        ),
        LatentFormat(
            "nvfp4_ds_mla",
            352,
            "512 e2m1 NoPE, 64 e4m3 RoPE, 32 e4m3 scales",
            False,
            _nvfp4_encode,
            _nvfp4_decode,
        ),
    )
}


def get_latent_format(name: str) -> LatentFormat:
    if name not in LATENT_FORMATS:
        raise ValueError(f"unknown latent format {name!r}; known: {', '.join(LATENT_FORMATS)}")
    return LATENT_FORMATS[name]
