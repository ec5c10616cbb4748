"""The Triton tier's host functions: the op contract's arguments in, each kernel with its
defaults (tuned on the H200). Each imports its kernel module at its first call, so registering
the tier (registration.py) imports neither Triton nor the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hwrun.ops.quantized_weight import QuantizedWeight


def logits_paged(
    q: torch.Tensor,  # [B, n, H, 128]
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8
    fmt: str,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32
    from hwrun.kernels.triton.indexer_logits import logits_paged

    return logits_paged(q, weights, cache, fmt, block_table, context_lens, max_ctx)


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128]
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, element_bytes] uint8
    key_scales: torch.Tensor,  # [N, scale_bytes] uint8
    fmt: str,
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
) -> torch.Tensor:  # [M, N] float32
    from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged

    return logits_ragged(q, weights, key_elements, key_scales, fmt, ks, ke)


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
) -> torch.Tensor:  # [R, k] int32
    from hwrun.kernels.triton.topk_threshold import topk

    return topk(logits, starts, ends, k)


def to_slots(
    indices: torch.Tensor,  # [R, k] int32, -1 = no token
    block_table: torch.Tensor,  # [B, max_blocks] int32
    block_size: int,
    request_of_row: torch.Tensor | None = None,  # [R] int
) -> torch.Tensor:  # [R, k] int32
    from hwrun.kernels.triton.to_slots import to_slots

    return to_slots(indices, block_table, block_size, request_of_row)


def decode(
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

    return decode(q, cache, fmt, slots, softmax_scale, topk_length, attn_sink, latent_scale)


def prefill(
    q: torch.Tensor,  # [T, H, 576] bfloat16
    kv: torch.Tensor,  # [S, 576] bfloat16 / float32 workspace
    indices: torch.Tensor,  # [T, k] int32, -1 invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [T] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, H, 512], lse [T, H] float32
    from hwrun.kernels.triton.sparse_mla import prefill

    return prefill(q, kv, indices, softmax_scale, topk_length, attn_sink)


def route(
    router_logits: torch.Tensor,  # [T, E] float
    top_k: int,
    scoring: str = "softmax",
    n_group: int | None = None,
    topk_group: int | None = None,
    e_score_correction_bias: torch.Tensor | None = None,  # [E] float
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # weights [T, k] float32, ids [T, k] int32
    from hwrun.kernels.triton.moe_route import route

    return route(
        router_logits,
        top_k,
        scoring,
        n_group,
        topk_group,
        e_score_correction_bias,
        renormalize,
        routed_scaling_factor,
    )


def experts(
    x: torch.Tensor,  # [T, D]
    w13: QuantizedWeight,  # [E, 2I, D]
    w2: QuantizedWeight,  # [E, D, I]
    ids: torch.Tensor,  # [T, k] int, -1 = not served here
    weights: torch.Tensor,  # [T, k] float32
    activation_mode: str = "bf16",
    shared_experts: tuple[QuantizedWeight, QuantizedWeight] | None = None,
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # a8w8: x's codes and scales
) -> torch.Tensor:  # [T, D] x.dtype
    from hwrun.kernels.triton.moe import experts

    return experts(x, w13, w2, ids, weights, activation_mode, shared_experts, quantized)


def linear(
    x: torch.Tensor,  # [T, C] bfloat16
    weight: QuantizedWeight,  # [R, C]
) -> torch.Tensor:  # [T, R] bfloat16
    from hwrun.kernels.triton.linear import linear

    return linear(x, weight)


def linear_a8w8(
    x: torch.Tensor,  # [T, C] bfloat16
    weight: QuantizedWeight,  # [R, C]
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # x's codes and scales
) -> torch.Tensor:  # [T, R] bfloat16
    from hwrun.kernels.triton.linear import linear_a8w8

    return linear_a8w8(x, weight, quantized=quantized)


def lse_combine(
    outs: torch.Tensor,  # [W, ..., D]
    lses: torch.Tensor,  # [W, ...] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., D], lse [...]
    from hwrun.kernels.triton.lse_combine import lse_combine

    return lse_combine(outs, lses)


def write_latent(
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8
    nope: torch.Tensor,  # [T, 512]
    rope: torch.Tensor,  # [T, 64]
    slots: torch.Tensor,  # [T] int32
    fmt: str,
    scale: float | None = None,
) -> None:
    from hwrun.kernels.triton.kv_write import write_latent

    write_latent(cache, nope, rope, slots, fmt, scale)


def write_index_keys(
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8
    keys: torch.Tensor,  # [T, 128]
    slots: torch.Tensor,  # [T] int32
    fmt: str,
) -> None:
    from hwrun.kernels.triton.kv_write import write_index_keys

    write_index_keys(cache, keys, slots, fmt)
