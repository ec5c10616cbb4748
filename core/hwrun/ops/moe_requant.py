"""Reference of ``moe.requant``: FP8 block-128 expert weights re-quantized to MXFP4.

The ROCm path of the seeds (``VLLM_FP8_MOE_REQUANT=mxfp4``): each expert is dequantized to
bf16 and quantized again to MXFP4 (E2M1 values, one E8M0 scale per 32 along the reduction
dimension). Going through bf16, as that path does, fixes the bytes: an fp32 intermediate can
round an amax across a power of two differently and change a block's scale. One expert
matrix is decoded at a time, so the transient memory is one ``[R, C]`` matrix, never a layer.
"""

from __future__ import annotations

import torch

from hwrun.formats.e8m0 import decode_e8m0
from hwrun.formats.fp8 import dequantize_fp8_block128
from hwrun.formats.mxfp4 import SCALE_RULES, quantize_mxfp4
from hwrun.ops.quantized_weight import QuantizedWeight

REQUANT_SOURCES: tuple[str, ...] = ("fp8_block128", "fp8_block128_ue8m0")
REQUANT_TARGETS: tuple[str, ...] = ("mxfp4",)


def requant_matrix_to_mxfp4(
    codes: torch.Tensor,  # [R, C] uint8 e4m3
    scales: torch.Tensor,  # [ceil(R/128), ceil(C/128)] fp32
    rule: str = "floor",
) -> tuple[torch.Tensor, torch.Tensor]:  # packed [R, C // 2] uint8, scales [R, C // 32] e8m0
    """One expert matrix: fp8 block-128 -> bf16 -> mxfp4."""
    as_bf16 = dequantize_fp8_block128(codes, scales).to(torch.bfloat16)
    return quantize_mxfp4(as_bf16, rule=rule)


def requant(
    weight: QuantizedWeight,  # [E, R, C] or [R, C] fp8_block128 / fp8_block128_ue8m0, C % 32 == 0
    target: str = "mxfp4",
    rule: str = "floor",
) -> QuantizedWeight:  # same shape, mxfp4
    """Re-quantize an FP8 block-128 weight to MXFP4, one expert matrix at a time.

    ``rule`` is the E8M0 scale rule of ``hwrun.formats.mxfp4`` (FLOOR, OCP's, by default).

    :raises ValueError: a source format other than fp8 block-128, a target other than mxfp4,
        or a reduction dimension C that is not a multiple of 32.
    """
    problems = []
    if weight.format not in REQUANT_SOURCES:
        problems.append(
            f"{weight.name} is {weight.format}; the source must be one of {list(REQUANT_SOURCES)}"
        )
    if target not in REQUANT_TARGETS:
        problems.append(f"target must be one of {list(REQUANT_TARGETS)}, got {target!r}")
    if rule not in SCALE_RULES:
        problems.append(f"rule must be one of {list(SCALE_RULES)}, got {rule!r}")
    if weight.shape[-1] % 32:
        problems.append(
            f"{weight.name} {list(weight.shape)}: mxfp4 needs the last dimension "
            "C to be a multiple of 32"
        )
    if problems:
        raise ValueError("moe.requant: " + "; ".join(problems))

    *lead, rows, cols = weight.shape
    packed = torch.empty((*lead, rows, cols // 2), dtype=torch.uint8, device=weight.device)
    scales = torch.empty((*lead, rows, cols // 32), dtype=torch.uint8, device=weight.device)
    matrices = [weight.expert(e) for e in range(lead[0])] if lead else [weight]
    for index, matrix in enumerate(matrices):
        block_scales = matrix.scales
        if matrix.format == "fp8_block128_ue8m0":
            block_scales = decode_e8m0(block_scales)
        out_packed, out_scales = requant_matrix_to_mxfp4(matrix.data, block_scales, rule)
        if lead:
            packed[index], scales[index] = out_packed, out_scales
        else:
            packed, scales = out_packed, out_scales
    return QuantizedWeight("mxfp4", weight.shape, packed, scales, name=weight.name)
