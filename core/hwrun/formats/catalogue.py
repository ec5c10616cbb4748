"""Every numeric format by name, with its element and scale sizes and a uniform codec.

Row formats (one token of a cache) have their own registries: ``latent.LATENT_FORMATS`` and
``index_keys.INDEX_KEY_FORMATS``. This catalogue covers the element and weight/activation
formats, so planners and reports can ask "how many bits per value" without knowing the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hwrun.formats import e4m3fnuz, fp8, int4, mxfp4, nvfp4


@dataclass(frozen=True)
class NumericFormat:
    """One format: ``element_bits`` per value, one ``scale_bits`` scale per ``block`` values
    (a shape: ``(32,)`` along the last dim, ``(128, 128)`` tiles), plus ``tensor_scale_bits``
    once per tensor. ``encode(x) -> tuple of tensors``; ``decode(*encoded) -> float32``."""

    name: str
    element_bits: int
    block: tuple[int, ...]
    scale_bits: int
    tensor_scale_bits: int
    summary: str
    encode: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    decode: Callable[..., torch.Tensor]

    @property
    def block_elements(self) -> int:
        size = 1
        for side in self.block:
            size *= side
        return size

    @property
    def bits_per_element(self) -> float:
        """Element bits plus the block scales' share (the tensor scale excluded)."""
        return self.element_bits + self.scale_bits / self.block_elements


NUMERIC_FORMATS: dict[str, NumericFormat] = {
    f.name: f
    for f in (
        NumericFormat(
            "e4m3",
            8,
            (),
            0,
            0,
            "FP8 E4M3 elements, no scale",
            lambda x: (fp8.encode_e4m3(x),),
            fp8.decode_e4m3,
        ),
        NumericFormat(
            "e4m3fnuz",
            8,
            (),
            0,
            0,
            "FP8 E4M3 FNUZ (gfx942: bias 8, max 240, NaN 0x80, no -0), no scale",
            lambda x: (e4m3fnuz.encode_e4m3fnuz(x),),
            e4m3fnuz.decode_e4m3fnuz,
        ),
        NumericFormat(
            "fp8_per_tensor",
            8,
            (),
            0,
            32,
            "E4M3 with one fp32 scale per tensor",
            fp8.quantize_fp8_per_tensor,
            fp8.dequantize_fp8_per_tensor,
        ),
        NumericFormat(
            "fp8_g128",
            8,
            (128,),
            32,
            0,
            "E4M3, fp32 scale per 128 (activations)",
            fp8.quantize_fp8_groups,
            fp8.dequantize_fp8_groups,
        ),
        NumericFormat(
            "fp8_g128_ue8m0",
            8,
            (128,),
            32,
            0,
            "E4M3, power-of-two fp32 scale per 128 (DeepSeek-V3.1/V3.2)",
            lambda x: fp8.quantize_fp8_groups(x, ue8m0=True),
            fp8.dequantize_fp8_groups,
        ),
        NumericFormat(
            "fp8_block128",
            8,
            (128, 128),
            32,
            0,
            "E4M3, fp32 scale per 128x128 tile",
            fp8.quantize_fp8_block128,
            fp8.dequantize_fp8_block128,
        ),
        NumericFormat(
            "mxfp4",
            4,
            (32,),
            8,
            0,
            "E2M1, E8M0 scale per 32 (OCP MX, FLOOR)",
            mxfp4.quantize_mxfp4,
            mxfp4.dequantize_mxfp4,
        ),
        NumericFormat(
            "nvfp4",
            4,
            (16,),
            8,
            32,
            "E2M1, E4M3 scale per 16, fp32 tensor scale",
            nvfp4.quantize_nvfp4,
            nvfp4.dequantize_nvfp4,
        ),
        NumericFormat(
            "int4_g128",
            4,
            (128,),
            32,
            0,
            "symmetric int4, fp32 scale per 128 (W4A16)",
            int4.quantize_int4_g128,
            int4.dequantize_int4_g128,
        ),
    )
}


def get_numeric_format(name: str) -> NumericFormat:
    if name not in NUMERIC_FORMATS:
        raise ValueError(f"unknown numeric format {name!r}; known: {', '.join(NUMERIC_FORMATS)}")
    return NUMERIC_FORMATS[name]
