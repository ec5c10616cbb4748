"""Sparse MLA on NVIDIA: the Triton decode (fp8_ds_mla and bf16 latents) and FlashMLA adapters."""

from __future__ import annotations

import torch

from hwrun.registry import OpImpl, OpRegistry, OpSpec
from hwrun_nvidia import flashmla
from hwrun_nvidia.device_checks import dtype_reasons, format_reasons, triton_reasons

TRITON_LATENT_FORMATS = ("fp8_ds_mla", "bf16")


def _validate_triton_decode(spec: OpSpec) -> list[str]:
    reasons = triton_reasons(spec, min_sm=80)
    reasons += format_reasons(spec, TRITON_LATENT_FORMATS, "latent")
    reasons += dtype_reasons(spec, ("bfloat16", "float16"), "query")
    if spec.head_dim not in (None, 576):
        reasons.append(f"head_dim must be 576 (absorbed MLA), got {spec.head_dim}")
    return reasons


def _triton_decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8
    fmt: str,
    slots: torch.Tensor,  # [B, s, k] int32
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
    latent_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512], lse [B, s, H] float32
    from hwrun.kernels.triton.sparse_mla import decode

    # Hopper (tuned on the H200): 128 heads x 32 entries per step, each program owning half of
    # the 512 output columns, 8 warps; without spills (V_PARTS=4 spills at 64 heads).
    return decode(q, cache, fmt, slots, softmax_scale, topk_length, attn_sink, latent_scale)


def register(registry: OpRegistry) -> None:
    registry.register(
        OpImpl(
            op="sparse_mla.decode",
            name="triton",
            platform=registry.platform,
            fn=_triton_decode,
            validate=_validate_triton_decode,
            priority=10,
            description="Triton: rows gathered from the paged cache as stored, online softmax",
        )
    )
    flashmla.register(registry)
