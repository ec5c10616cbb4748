"""The MoE op family: routing, expert computation over quantized weights, load-time requant.

The references live beside this module, one job each: ``moe_route`` (``moe.route``).
"""

from __future__ import annotations

from hwrun.ops.contract import OpContract
from hwrun.ops.moe_route import route
from hwrun.registry import OpSpec

CONTRACTS: list[OpContract] = [
    OpContract(
        name="moe.route",
        summary="router logits [T,E] -> fp32 weights [T,k], int32 ids [T,k] (softmax/sigmoid, "
        "grouped top-k with correction bias, renormalize, routed scaling)",
        reference=route,
        # DeepSeek-V3.2's router: 256 experts in 8 groups, 4 groups kept, 8 experts per token.
        default_spec=OpSpec(op="moe.route", dtype="float32", topk=8),
    ),
]
