"""The dense-linear ops: a projection over a weight held in its storage format.

- ``dense.linear``: bf16 activations (transformers' numerics);
- ``dense.linear_a8w8``: activations rounded to fp8 first (DeepSeek's inference numerics).

``dense.linear``

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

``dense.linear_a8w8``

``out = decode(quantize(x)) @ decode(W)^T`` for a block-FP8 ``W``: ``x`` is first quantized per
token and 128 columns to e4m3 (``hwrun.formats.fp8.quantize_fp8_groups``: scale
``max(amax, 1e-4) / 448``, rounded up to a power of two when the weight's scales are ue8m0), as
DeepSeek-V3/V3.2's inference code does before each of its FP8 GEMMs (``act_quant`` then
``fp8_gemm``) and as DeepGEMM's ``fp8_gemm_nt`` and AITER's ``gemm_a8w8_blockscale`` take their
input. Then ``dense.linear``'s numerics over the decoded activations: exact decodes, fp32 products
and sums, one rounding to ``x``'s dtype. A kernel that multiplies the e4m3 codes of both sides
and scales each 128-wide K step's sum by ``x_scale * w_scale`` differs by fp32 summation order
and by where the scales' products round. It may also sum a K step on the fp8 tensor cores at
their own precision before adding it to fp32 (Hopper keeps about 14 bits of the running sum:
DeepSeek-V3 report, 3.3.2; DeepGEMM's ``fp8_gemm_nt`` promotes once per 128 columns, which is
DeepSeek's production numerics): its error then follows the size of an output's terms,
``sum |x_k * w_k|``, not the output, and conformance allows 2^-10 of the terms
(``allclose_terms``). ``C`` must be a multiple of 128.

``quantized`` (optional): ``x``'s codes ``[T, C]`` uint8 and scales ``[T, C / 128]`` fp32 (any
strides) exactly as ``quantize_fp8_groups(x, 128, ue8m0)`` gives them, made beforehand (the
engine's norm kernel writes them beside its output): an impl may read them instead of
quantizing ``x`` again. They are the caller's promise; the result is still defined by ``x``
(the reference quantizes ``x`` and reads only their shapes).
"""

from __future__ import annotations

import torch

from hwrun.formats.fp8 import BLOCK, dequantize_fp8_groups, quantize_fp8_groups
from hwrun.ops.contract import OpContract
from hwrun.ops.quantized_weight import QuantizedWeight
from hwrun.registry import OpSpec

# Weight formats of ``dense.linear`` (a subset of quantized_weight.WEIGHT_FORMATS).
LINEAR_WEIGHT_FORMATS: tuple[str, ...] = ("bf16", "fp8_block128", "fp8_block128_ue8m0")
# Weight formats of ``dense.linear_a8w8``: block-FP8 only (fp8 against fp8).
A8W8_WEIGHT_FORMATS: tuple[str, ...] = ("fp8_block128", "fp8_block128_ue8m0")


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
    return _rows_times(x.float(), weight).to(x.dtype)


def linear_a8w8(
    x: torch.Tensor,  # [T, C] bfloat16 (any float dtype; the output has the same), C % 128 == 0
    weight: QuantizedWeight,  # [R, C] in one of A8W8_WEIGHT_FORMATS
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # x's codes and scales
) -> torch.Tensor:  # [T, R] x.dtype
    """``decode(quantize(x)) @ decode(weight)^T`` in fp32, rounded once to ``x.dtype``: ``x``
    quantized per token and 128 columns (see the module doc; ue8m0 scales with a ue8m0 weight).
    ``quantized``: see the module doc (checked for shape, dtype and device only).

    :raises ValueError: every reason at once: ``dense.linear``'s, a format outside
        A8W8_WEIGHT_FORMATS, C not a multiple of 128, ``quantized`` not codes and scales of
        ``x``'s shape on its device.
    """
    check_linear_a8w8_args(x, weight, quantized)
    return _rows_times(quantize_activations(x, weight.format), weight).to(x.dtype)


def quantize_activations(x: torch.Tensor, weight_format: str) -> torch.Tensor:  # [T, C] fp32
    """``x`` rounded to e4m3 per token and 128 columns and decoded back to fp32 (exactly), with
    ue8m0 scales for a ``fp8_block128_ue8m0`` weight: ``dense.linear_a8w8``'s input."""
    if x.shape[0] == 0:
        return x.float()
    ue8m0 = weight_format == "fp8_block128_ue8m0"
    return dequantize_fp8_groups(*quantize_fp8_groups(x.float(), BLOCK, ue8m0=ue8m0))


def _rows_times(xf: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:  # [T, R] fp32
    w = weight.dequantize()  # [R, C] fp32, exact
    out = torch.empty(xf.shape[0], w.shape[0], dtype=torch.float32, device=xf.device)
    for row in range(xf.shape[0]):
        out[row] = w @ xf[row]
    return out


def check_linear_a8w8_args(
    x: torch.Tensor,
    weight: QuantizedWeight,
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """:func:`check_linear_args` for ``dense.linear_a8w8``: block-FP8 weights, whole groups of
    128 columns; ``quantized``, when given, codes and scales of ``x``'s shape on its device."""
    check_linear_args(x, weight, "dense.linear_a8w8", A8W8_WEIGHT_FORMATS, whole_groups=True)
    problems = quantized_input_problems(x, quantized)
    if problems:
        raise ValueError("dense.linear_a8w8: " + "; ".join(problems))


def quantized_input_problems(
    x: torch.Tensor, quantized: tuple[torch.Tensor, torch.Tensor] | None
) -> list[str]:
    """Why ``quantized`` cannot be ``x``'s codes ``[T, C]`` uint8 and scales ``[T, C / 128]``
    fp32 on ``x``'s device (none when it is None): the check of ``dense.linear_a8w8``'s and
    ``moe.experts``' ``quantized`` argument."""
    if quantized is None:
        return []
    t, c = x.shape
    problems = []
    if not isinstance(quantized, tuple | list) or len(quantized) != 2:
        problems.append(
            f"quantized must be (codes, scales), got {type(quantized).__name__}"
            + (f" of {len(quantized)}" if isinstance(quantized, tuple | list) else "")
        )
    else:
        for name, tensor, dtype, shape in (
            ("codes", quantized[0], torch.uint8, (t, c)),
            ("scales", quantized[1], torch.float32, (t, c // BLOCK)),
        ):
            if not isinstance(tensor, torch.Tensor):
                problems.append(f"quantized {name} must be a tensor, got {type(tensor).__name__}")
            elif tensor.dtype != dtype or tuple(tensor.shape) != shape:
                problems.append(
                    f"quantized {name} must be {dtype} {list(shape)} (x is {list(x.shape)}), "
                    f"got {tensor.dtype} {list(tensor.shape)}"
                )
            elif tensor.device != x.device:
                problems.append(f"quantized {name} is on {tensor.device} but x on {x.device}")
    return problems


def check_linear_args(
    x: torch.Tensor,
    weight: QuantizedWeight,
    op: str = "dense.linear",
    formats: tuple[str, ...] = LINEAR_WEIGHT_FORMATS,
    whole_groups: bool = False,
) -> None:
    """Every reason ``x`` and ``weight`` cannot be an ``op`` call (``formats``: its weight
    formats; ``whole_groups``: C must be a multiple of 128), raised at once (shapes, formats and
    devices only: nothing here reads a device value)."""
    if not isinstance(weight, QuantizedWeight):
        raise ValueError(
            f"{op}: weight must be a QuantizedWeight [R, C], got {type(weight).__name__}; "
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
    if weight.format not in formats:
        problems.append(f"weight ({weight.name}) is {weight.format}; {op} takes {list(formats)}")
    if whole_groups and len(weight.shape) == 2 and weight.shape[1] % BLOCK:
        problems.append(
            f"C = {weight.shape[1]} must be a multiple of {BLOCK} (the activations are quantized "
            f"in groups of {BLOCK}); run this weight through dense.linear"
        )
    if isinstance(x, torch.Tensor) and weight.device != x.device:
        problems.append(f"x is on {x.device} but weight ({weight.name}) on {weight.device}")
    if problems:
        raise ValueError(f"{op}: " + "; ".join(problems))


def linear_reference_reasons(spec: OpSpec) -> list[str]:
    """The reference takes every weight format of the op, any float input, on any device."""
    return _unknown_formats(spec, LINEAR_WEIGHT_FORMATS)


def linear_a8w8_reference_reasons(spec: OpSpec) -> list[str]:
    return _unknown_formats(spec, A8W8_WEIGHT_FORMATS)


def _unknown_formats(spec: OpSpec, formats: tuple[str, ...]) -> list[str]:
    unknown = [f for f in spec.formats if f not in formats]
    if unknown:
        return [f"weight format(s) {unknown} are not one of {list(formats)}"]
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
    OpContract(
        name="dense.linear_a8w8",
        summary="x [T,C] quantized to e4m3 per token and 128 columns, @ decode(W)^T, W [R,C] "
        "fp8 block-128 -> [T,R] in x's dtype; fp32 products, one rounding",
        reference=linear_a8w8,
        # DeepSeek-V3.2's FP8 GEMMs as its inference code runs them (ue8m0 scales there).
        default_spec=OpSpec(op="dense.linear_a8w8", dtype="bfloat16", formats=("fp8_block128",)),
        reference_validate=linear_a8w8_reference_reasons,
    ),
]
