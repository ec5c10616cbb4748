"""The MoE op family: routing, expert computation over quantized weights, load-time requant.

The references live beside this module, one job each: ``moe_route`` (``moe.route``),
``moe_experts`` (``moe.experts``), ``moe_requant`` (``moe.requant``); the weight type they
share is ``quantized_weight.QuantizedWeight``.

``OpSpec.formats`` of the MoE ops: ``moe.experts`` takes the weight format, then optionally the
activation mode (``("mxfp4", "a8w4")``); ``moe.requant`` takes the source then the target
format (``("fp8_block128", "mxfp4")``).
"""

from __future__ import annotations

from hwrun.ops.contract import OpContract
from hwrun.ops.moe_experts import ACTIVATION_MODES, experts
from hwrun.ops.moe_requant import REQUANT_SOURCES, REQUANT_TARGETS, requant
from hwrun.ops.moe_route import route
from hwrun.ops.quantized_weight import WEIGHT_FORMATS
from hwrun.registry import OpSpec


def experts_reference_reasons(spec: OpSpec) -> list[str]:
    """The reference runs every weight format and activation mode it knows, on any device."""
    reasons = []
    weight_format, *modes = spec.formats or ("bf16",)
    if weight_format not in WEIGHT_FORMATS:
        reasons.append(f"weight format {weight_format!r} is not one of {list(WEIGHT_FORMATS)}")
    for mode in modes:
        allowed = ACTIVATION_MODES.get(mode, ((),))[0]
        if mode not in ACTIVATION_MODES:
            reasons.append(f"activation mode {mode!r} is not one of {list(ACTIVATION_MODES)}")
        elif allowed is not None and weight_format not in allowed:
            reasons.append(
                f"activation mode {mode!r} needs {'/'.join(allowed)} weights, got {weight_format!r}"
            )
    return reasons


def requant_reference_reasons(spec: OpSpec) -> list[str]:
    source = spec.formats[0] if spec.formats else "fp8_block128"
    target = spec.formats[1] if len(spec.formats) > 1 else "mxfp4"
    reasons = []
    if source not in REQUANT_SOURCES:
        reasons.append(f"source format {source!r} is not one of {list(REQUANT_SOURCES)}")
    if target not in REQUANT_TARGETS:
        reasons.append(f"target format {target!r} is not one of {list(REQUANT_TARGETS)}")
    return reasons


CONTRACTS: list[OpContract] = [
    OpContract(
        name="moe.route",
        summary="router logits [T,E] -> fp32 weights [T,k], int32 ids [T,k] (softmax/sigmoid, "
        "grouped top-k with correction bias, renormalize, routed scaling)",
        reference=route,
        # DeepSeek-V3.2's router: 256 experts in 8 groups, 4 groups kept, 8 experts per token.
        default_spec=OpSpec(op="moe.route", dtype="float32", topk=8),
    ),
    OpContract(
        name="moe.experts",
        summary="x [T,D], quantized w13 [E,2I,D] and w2 [E,D,I], ids/weights [T,k] -> [T,D]: "
        "sum_k w_k * W2_e(silu(gate)*up) + shared experts; bf16/a8w4/a4w4/a8w8 activations "
        "(a8w8: x's codes may be handed over, quantized=)",
        reference=experts,
        # The ROCm FP8-requant path's default: MXFP4 experts with fp8 activations.
        default_spec=OpSpec(op="moe.experts", dtype="bfloat16", formats=("mxfp4", "a8w4"), topk=8),
        reference_validate=experts_reference_reasons,
    ),
    OpContract(
        name="moe.requant",
        summary="fp8 block-128 expert weights + scales -> mxfp4, one expert matrix at a time",
        reference=requant,
        default_spec=OpSpec(op="moe.requant", formats=("fp8_block128", "mxfp4")),
        reference_validate=requant_reference_reasons,
    ),
]
