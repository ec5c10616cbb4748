"""The dense-linear op: ``dense.linear``, a projection over a weight held in its storage format.

``out = x @ decode(W)^T`` for ``x [T, C]`` and ``W`` a :class:`QuantizedWeight` ``[R, C]`` in
``bf16``, ``fp8_block128`` or ``fp8_block128_ue8m0`` (a block-FP8 checkpoint's projections, kept
as stored so a decode step reads one byte per weight instead of two).

Numerics (what a kernel must match), the weight side of ``moe.experts``'s definition: the weight
is decoded exactly by ``hwrun.formats`` (e4m3 code times its tile's scale, in fp32); ``x`` is
used as given (bf16 on a GPU, fp32 in the CPU engine), widened exactly to fp32; products and
sums are fp32; the result is rounded once to ``x``'s dtype. A kernel that keeps the e4m3 codes
in its matrix units and multiplies each 128-wide K step's partial sum by the tile's scale
computes the same sum in another order (and rounds ``code * scale`` never, where the reference
rounds it once to fp32): the differences are fp32 summation order. No activation quantization:
a kernel that rounds ``x`` to fp8 computes another op.

Every row is computed on its own (a matrix-vector product: CPU BLAS rounds a matrix product
differently with its row count), so a row's output does not depend on the batch it came in.

``OpSpec.formats`` of ``dense.linear``: every weight format the caller passes (the engine lists
those of its block-FP8 projections), e.g. ``("fp8_block128",)``; ``dtype`` is ``x``'s.
"""

from __future__ import annotations

import torch

from hwrun.ops.contract import OpContract
from hwrun.ops.quantized_weight import QuantizedWeight
from hwrun.registry import OpSpec

# Weight formats of ``dense.linear`` (a subset of quantized_weight.WEIGHT_FORMATS).
LINEAR_WEIGHT_FORMATS: tuple[str, ...] = ("bf16", "fp8_block128", "fp8_block128_ue8m0")


def linear(
    x: torch.Tensor,  # [T, C] bfloat16 (any float dtype; the output has the same)
    weight: QuantizedWeight,  # [R, C] in one of LINEAR_WEIGHT_FORMATS
) -> torch.Tensor:  # [T, R] x.dtype
    """``x @ decode(weight)^T`` in fp32, rounded once to ``x.dtype`` (see the module doc).

    Partial scale tiles are allowed (R or C not a multiple of 128: the last tile's scale covers
    the rows and columns there are). ``T`` may be 0.

    :raises ValueError: every reason at once: ``x`` not a float ``[T, C]`` tensor, ``weight`` not
        a 2-D QuantizedWeight whose C matches, a format outside LINEAR_WEIGHT_FORMATS, tensors
        on different devices.
    """
    check_linear_args(x, weight)
    w = weight.dequantize()  # [R, C] fp32, exact
    xf = x.float()
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for row in range(x.shape[0]):
        out[row] = w @ xf[row]
    return out.to(x.dtype)


def check_linear_args(x: torch.Tensor, weight: QuantizedWeight) -> None:
    """Every reason ``x`` and ``weight`` cannot be a ``dense.linear`` call, raised at once (shapes,
    formats and devices only: nothing here reads a device value)."""
    if not isinstance(weight, QuantizedWeight):
        raise ValueError(
            f"dense.linear: weight must be a QuantizedWeight [R, C], got {type(weight).__name__}; "
            "wrap a plain tensor with quantize_weight(w, 'bf16')"
        )
    problems = []
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        problems.append(f"x must be a float tensor [T, C], got {got}")
    if len(weight.shape) != 2:
        problems.append(
            f"weight ({weight.name}) must be [R, C], got {list(weight.shape)} (an expert stack "
            "is moe.experts' weight)"
        )
    elif not problems and x.shape[1] != weight.shape[1]:
        problems.append(
            f"x is [T, C] = {list(x.shape)} but weight ({weight.name}) is [R, C] = "
            f"{list(weight.shape)}: C must agree"
        )
    if weight.format not in LINEAR_WEIGHT_FORMATS:
        problems.append(
            f"weight ({weight.name}) is {weight.format}; dense.linear takes "
            f"{list(LINEAR_WEIGHT_FORMATS)}"
        )
    if isinstance(x, torch.Tensor) and weight.device != x.device:
        problems.append(f"x is on {x.device} but weight ({weight.name}) on {weight.device}")
    if problems:
        raise ValueError("dense.linear: " + "; ".join(problems))


def linear_reference_reasons(spec: OpSpec) -> list[str]:
    """The reference takes every weight format of the op, any float input, on any device."""
    unknown = [f for f in spec.formats if f not in LINEAR_WEIGHT_FORMATS]
    if unknown:
        return [f"weight format(s) {unknown} are not one of {list(LINEAR_WEIGHT_FORMATS)}"]
    return []


CONTRACTS: list[OpContract] = [
    OpContract(
        name="dense.linear",
        summary="x [T,C] @ decode(W)^T, W [R,C] bf16 / fp8 block-128 (fp32 or ue8m0 scales) -> "
        "[T,R] in x's dtype; fp32 products, one rounding",
        reference=linear,
        # A block-FP8 checkpoint's projections with bf16 activations (DeepSeek-V3.2 on a GPU).
        default_spec=OpSpec(op="dense.linear", dtype="bfloat16", formats=("fp8_block128",)),
        reference_validate=linear_reference_reasons,
    ),
]
