"""The DSA indexer on NVIDIA: Triton logits (paged, ragged) and top-k; DeepGEMM logits adapters.

Priorities: DeepGEMM (when it imports and the spec suits it) 20, Triton 10. Both are refused
with reasons on CPU tensors or without a CUDA device.
"""

from __future__ import annotations

import torch

from hwrun.registry import OpImpl, OpRegistry, OpSpec
from hwrun_nvidia import deepgemm
from hwrun_nvidia.device_checks import dtype_reasons, format_reasons, triton_reasons

TRITON_KEY_FORMATS = ("fp8", "mxfp4")
QUERY_DTYPES = ("float8_e4m3fn", "bfloat16", "float16", "float32")


def _validate_triton_logits(spec: OpSpec) -> list[str]:
    # fp8 queries use the fp8 tensor cores (sm_89+); other dtypes run in bf16 on sm_80+.
    min_sm = 89 if spec.dtype == "float8_e4m3fn" else 80
    reasons = triton_reasons(spec, min_sm)
    reasons += format_reasons(spec, TRITON_KEY_FORMATS, "index-key")
    reasons += dtype_reasons(spec, QUERY_DTYPES, "query")
    if spec.head_dim not in (None, 128):
        reasons.append(f"head_dim must be 128, got {spec.head_dim}")
    if spec.block_size is not None and spec.block_size & (spec.block_size - 1):
        reasons.append(f"block_size must be a power of two, got {spec.block_size}")
    return reasons


def _validate_triton_topk(spec: OpSpec) -> list[str]:
    return triton_reasons(spec) + dtype_reasons(spec, ("float32",), "logits")


def _triton_logits_paged(
    q: torch.Tensor,  # [B, n, H, 128]
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8
    fmt: str,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32
    from hwrun.kernels.triton.indexer_logits import logits_paged

    # Hopper (tuned on the H200): 4 warps per 64-token block, 4 cp.async stages, ~8 programs
    # per multiprocessor.
    return logits_paged(q, weights, cache, fmt, block_table, context_lens, max_ctx)


def _triton_logits_ragged(
    q: torch.Tensor,  # [M, H, 128]
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, element_bytes] uint8
    key_scales: torch.Tensor,  # [N, scale_bytes] uint8
    fmt: str,
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
) -> torch.Tensor:  # [M, N] float32
    from hwrun.kernels.triton.indexer_logits import logits_ragged

    return logits_ragged(q, weights, key_elements, key_scales, fmt, ks, ke)


def _triton_topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
) -> torch.Tensor:  # [R, k] int32
    from hwrun.kernels.triton.topk import topk

    return topk(logits, starts, ends, k)


def register(registry: OpRegistry) -> None:
    platform = registry.platform
    registry.register(
        OpImpl(
            op="indexer.logits_paged",
            name="triton",
            platform=platform,
            fn=_triton_logits_paged,
            validate=_validate_triton_logits,
            priority=10,
            description="Triton: fp8 / mxfp4 keys read packed (68 B/token for mxfp4)",
        )
    )
    registry.register(
        OpImpl(
            op="indexer.logits_ragged",
            name="triton",
            platform=platform,
            fn=_triton_logits_ragged,
            validate=_validate_triton_logits,
            priority=10,
            description="Triton: fp8 / mxfp4 keys, one key tile against a group of rows",
        )
    )
    registry.register(
        OpImpl(
            op="indexer.topk",
            name="triton",
            platform=platform,
            fn=_triton_topk,
            validate=_validate_triton_topk,
            priority=10,
            description="Triton radix select (11-bit histograms, smallest index wins ties)",
        )
    )
    deepgemm.register(registry)
