"""Index keys: one token of the DSA indexer's key cache (128 dims), and its block-major pages.

Formats (docs/formats.md has the byte tables):

- ``bf16`` (256 B/token): 128 little-endian bf16, no scale; the exact format.
- ``fp8`` (132 B/token): 128 e4m3 + one little-endian fp32 scale. Scale rule: DeepSeek-V3.2's
  ``scale_fmt="ue8m0"`` as vLLM's ``indexer_k_quant_and_cache`` writes it:
  ``2^ceil(log2(max(amax, 1e-4) / 448))`` (exact ceiling), elements ``e4m3(x / scale)``.
- ``mxfp4`` (68 B/token): 64 bytes of packed e2m1 (element 2i in the low nibble of byte i) +
  4 ue8m0 scales, one per 32 dims. Scale rule: DeepGEMM's SM100 indexer rule
  ``2^ceil(log2(max(amax, 1e-4) / 6))`` (RCEIL with an amax floor; elements never saturate),
  not OCP FLOOR: keys are consumed by paged indexer kernels whose public writers use it, and
  FLOOR would clip a block's largest component by up to 25%, the component that dominates
  the score.

Pages (DeepGEMM's paged indexer cache): one block of ``block_size`` tokens is
``block_size * bytes_per_token`` bytes: all element rows of the block first (token i at
``i * element_bytes``), then all scale rows (token i at
``block_size * element_bytes + i * scale_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hwrun.formats.arith import canonical_nan
from hwrun.formats.checks import require_float, require_uint8
from hwrun.formats.e2m1 import encode_scaled_blocks
from hwrun.formats.fp8 import decode_e4m3, encode_e4m3, scale_from_amax
from hwrun.formats.mxfp4 import MX_BLOCK, decode_scaled_blocks, mx_scale

INDEX_DIM = 128
AMAX_FLOOR = 1e-4
Codec = tuple[torch.Tensor, torch.Tensor]


def _bf16_encode(keys: torch.Tensor) -> Codec:
    elements = canonical_nan(keys.to(torch.bfloat16)).view(torch.uint8)
    return elements, elements.new_empty((*keys.shape[:-1], 0))


def _bf16_decode(elements: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return elements.contiguous().view(torch.bfloat16).float()


def _fp8_encode(keys: torch.Tensor) -> Codec:
    scale = scale_from_amax(keys.abs().amax(dim=-1, keepdim=True), ue8m0=True)
    return encode_e4m3(keys / scale), scale.view(torch.uint8)


def _fp8_decode(elements: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return decode_e4m3(elements) * scales.contiguous().view(torch.float32)


def _mxfp4_encode(keys: torch.Tensor) -> Codec:
    blocks = keys.reshape(-1, MX_BLOCK)
    packed, scales = encode_scaled_blocks(
        blocks, lambda a: mx_scale(a.clamp(min=AMAX_FLOOR), "rceil")
    )
    lead = keys.shape[:-1]
    return packed.reshape(*lead, INDEX_DIM // 2), scales.reshape(*lead, INDEX_DIM // MX_BLOCK)


def _mxfp4_decode(elements: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return decode_scaled_blocks(elements, scales)


@dataclass(frozen=True)
class IndexKeyFormat:
    """One index-key format: bytes per token, split into element bytes and scale bytes."""

    name: str
    bytes_per_token: int
    element_bytes: int
    scale_bytes: int
    _encode: Callable[[torch.Tensor], Codec]
    _decode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def encode(self, keys: torch.Tensor) -> Codec:  # keys [T, 128] float
        """Returns (elements [T, element_bytes] uint8, scales [T, scale_bytes] uint8)."""
        kf = require_float(keys, f"index key {self.name}.encode", "[T, 128]")
        if kf.dim() == 0 or kf.shape[-1] != INDEX_DIM:
            raise ValueError(
                f"index key {self.name}.encode: expected keys [T, 128], got {tuple(keys.shape)}"
            )
        return self._encode(kf)

    def decode(
        self,
        elements: torch.Tensor,  # [T, element_bytes] uint8 (any leading dims, e.g. a page)
        scales: torch.Tensor,  # [T, scale_bytes] uint8
    ) -> torch.Tensor:  # [T, 128] float32
        want = f"elements [T, {self.element_bytes}] and scales [T, {self.scale_bytes}] uint8"
        what = f"index key {self.name}.decode"
        require_uint8(elements, what, want)
        require_uint8(scales, what, want)
        ok = (
            elements.dim() > 0
            and elements.shape[-1] == self.element_bytes
            and tuple(scales.shape) == (*elements.shape[:-1], self.scale_bytes)
        )
        if not ok:
            raise ValueError(
                f"{what}: expected {want}, got {tuple(elements.shape)} and {tuple(scales.shape)}"
            )
        return self._decode(elements, scales)

    def split_pages(
        self,
        cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8 (strided ok)
        block_size: int,
    ) -> Codec:  # elements [num_blocks, block_size, element_bytes], scales [.., scale_bytes]
        """Views of a block-major page's element rows and scale rows (no copy)."""
        width = block_size * self.bytes_per_token
        require_uint8(cache, f"index key {self.name}.split_pages", f"[num_blocks, {width}]")
        if block_size <= 0 or cache.dim() != 2 or cache.shape[1] != width:
            raise ValueError(
                f"index key {self.name}.split_pages: expected cache "
                f"[num_blocks, block_size * {self.bytes_per_token}] = "
                f"[num_blocks, {width}] for block_size {block_size}, got "
                f"{tuple(cache.shape)}"
            )
        split = block_size * self.element_bytes
        elements = cache[:, :split].unflatten(1, (block_size, self.element_bytes))
        scales = cache[:, split:].unflatten(1, (block_size, self.scale_bytes))
        return elements, scales


INDEX_KEY_FORMATS: dict[str, IndexKeyFormat] = {
    f.name: f
    for f in (
        IndexKeyFormat("bf16", 256, 256, 0, _bf16_encode, _bf16_decode),
        IndexKeyFormat("fp8", 132, 128, 4, _fp8_encode, _fp8_decode),
        IndexKeyFormat("mxfp4", 68, 64, 4, _mxfp4_encode, _mxfp4_decode),
    )
}


def get_index_key_format(name: str) -> IndexKeyFormat:
    if name not in INDEX_KEY_FORMATS:
        raise ValueError(
            f"unknown index key format {name!r}; known: {', '.join(INDEX_KEY_FORMATS)}"
        )
    return INDEX_KEY_FORMATS[name]
