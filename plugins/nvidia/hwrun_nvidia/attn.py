"""attn.lse_combine on NVIDIA: the Triton merge."""

from __future__ import annotations

import torch

from hwrun.registry import OpImpl, OpRegistry, OpSpec
from hwrun_nvidia.device_checks import dtype_reasons, triton_reasons


def _validate(spec: OpSpec) -> list[str]:
    return triton_reasons(spec) + dtype_reasons(spec, ("float32", "bfloat16", "float16"), "outs")


def _triton_lse_combine(
    outs: torch.Tensor,  # [W, ..., D]
    lses: torch.Tensor,  # [W, ...] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., D], lse [...]
    from hwrun.kernels.triton.lse_combine import lse_combine

    return lse_combine(outs, lses)


def register(registry: OpRegistry) -> None:
    registry.register(
        OpImpl(
            op="attn.lse_combine",
            name="triton",
            platform=registry.platform,
            fn=_triton_lse_combine,
            validate=_validate,
            priority=10,
            description="Triton: parts folded in index order, -inf parts add nothing",
        )
    )
