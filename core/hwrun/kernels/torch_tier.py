"""Graph-safe torch implementations of the small ops no kernel library covers.

``indexer.to_slots`` and ``moe.route`` are a few tensor operations each. Their references check
their inputs' *values* (an index below -1, a NaN logit) and raise, which synchronises with the
host and so cannot sit inside a CUDA graph. These impls compute the same results with the same
torch operations (so the same bits), check only shapes, and are registered for CUDA devices, where
the engine captures its decode steps. Out-of-range values are not reported here: the reference
(and the conformance suite, which runs both) is where a caller's bad input is diagnosed.

The Triton tier serves both ops above these in one launch each (the H200's decode profile
counted ~45 kernels in this route and ~6 in this to_slots); these stay registered under it, for
a pin or a spec it refuses.
"""

from __future__ import annotations

import torch

from hwrun.ops.moe_route import route_unchecked
from hwrun.ops.topk import to_slots_arg_problems
from hwrun.registry import OpImpl, OpRegistry, OpSpec

TORCH_TIER_PRIORITY = 5  # under Triton (10): the floor a GPU platform serves without syncs
DEVICE_TYPES = ("cuda",)


def to_slots(
    indices: torch.Tensor,  # [R, k] int32, token positions (-1 = none)
    block_table: torch.Tensor,  # [B, max_blocks] int32
    block_size: int,
    request_of_row: torch.Tensor | None = None,  # [R] int
) -> torch.Tensor:  # [R, k] int32 slots, -1 where indices is -1
    """``table[req, i // bs] * bs + i % bs`` as the reference defines it, without value checks."""
    problems = to_slots_arg_problems(indices, block_table, block_size, request_of_row)
    if problems:
        raise ValueError("indexer.to_slots: " + "; ".join(problems))
    rows, requests = indices.shape[0], block_table.shape[0]
    if request_of_row is None:
        request_of_row = torch.arange(rows, device=indices.device) // (rows // requests)
    idx = indices.long()
    valid = idx >= 0
    last = block_table.shape[1] * block_size - 1
    safe = torch.where(valid, idx, torch.zeros_like(idx)).clamp(max=last)
    blocks = block_table.long()[request_of_row.long()[:, None], safe // block_size]
    slots = blocks * block_size + safe % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1)).to(torch.int32)


def _on_cuda(spec: OpSpec) -> list[str]:
    if spec.device_type not in DEVICE_TYPES:
        return [
            f"tensors are on {spec.device_type!r}: the graph-safe torch impls are for CUDA "
            "devices (on the CPU the reference computes the same)"
        ]
    return []


def register_torch_tier(registry: OpRegistry) -> None:
    """Register the graph-safe torch impls on ``registry`` (a GPU platform's)."""
    for op, fn, what in (
        ("indexer.to_slots", to_slots, "block-table lookup"),
        ("moe.route", route_unchecked, "the reference's computation without its host checks"),
    ):
        registry.register(
            OpImpl(
                op=op,
                name="torch",
                platform=registry.platform,
                fn=fn,
                validate=_on_cuda,
                priority=TORCH_TIER_PRIORITY,
                description=f"torch, graph-safe: {what}",
                graph_safe=True,
                batch_invariant=True,  # row-wise operations only, as the reference
            )
        )
