"""The NVIDIA plugin's Gluon kernels (Hopper, sm_90), behind ``HWRUN_GLUON`` (off by default;
tested on an H200): ``indexer.logits_paged`` over mxfp4 and fp8 index keys
(:mod:`hwrun_nvidia.gluon_paged_logits`), a call they do not cover (more than one query row a
request, other queries) going to the Triton kernel; and ``sparse_mla.decode`` over fp8_ds_mla
rows (:mod:`hwrun_nvidia.gluon_sparse_mla`; tested and conformant on an H100, its
warp-specialised kernel at 1.37x FlashMLA's time); and ``indexer.topk``, the Triton top-k with
its threshold search, compaction and select Gluon's (:mod:`hwrun_nvidia.gluon_topk`; conformant
on an H100, 64 x 131072 from 44.3 to 34.1 us, 0.21x torch.topk). A Gluon ragged-logits kernel
over fp8 keys was tried (73c15ba) and removed: on an H100 it took 1.20x DeepGEMM's time where
the Triton kernel takes 1.05x (docs/benchmarks.md).
Priority 15: above the Triton tier, under DeepGEMM and FlashMLA, which keep what they serve where
they are installed (DeepGEMM reads no mxfp4).

Gluon ships with Triton (3.6 on the H200); its kernels are imported at the first call. The
logits and attention kernels use the warpgroup MMA, which only sm_90 has (Blackwell's tensor
cores take other instructions); the top-k's use nothing Hopper's own but were built and tested
for it only.
"""

from __future__ import annotations

import torch

from hwrun import knobs
from hwrun.registry import OpImpl, OpRegistry, OpSpec, dtype_reasons, format_reasons
from hwrun_nvidia.device_checks import cuda_reasons, importable


def _gluon_reasons(spec: OpSpec, sm90_only: str = "the warpgroup MMA is sm_90's only") -> list[str]:
    reasons = []
    if not knobs.gluon_kernels():
        reasons.append("HWRUN_GLUON is off (set HWRUN_GLUON=1 to use the Gluon kernels)")
    if not importable("triton.experimental.gluon"):
        reasons.append("this Triton has no Gluon (it ships with Triton 3.5 and later)")
    reasons += cuda_reasons(spec, min_sm=90)
    if spec.arch is not None and not spec.arch.startswith("sm_90"):
        reasons.append(f"{sm90_only}, the device is {spec.arch}")
    return reasons


def _validate(spec: OpSpec) -> list[str]:
    reasons = _gluon_reasons(spec)
    reasons += format_reasons(spec, ("mxfp4", "fp8"), "index-key")
    reasons += dtype_reasons(spec, ("float8_e4m3fn",), "query")
    if spec.head_dim not in (None, 128):
        reasons.append(f"it needs head_dim 128, got {spec.head_dim}")
    if spec.block_size not in (None, 64):
        reasons.append(f"it reads 64-token pages, got {spec.block_size}")
    return reasons


def logits_paged(
    q: torch.Tensor,  # [B, n, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, 64 * 68] uint8
    fmt: str,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf past each row's length
    from hwrun_nvidia import gluon_paged_logits

    if gluon_paged_logits.shape_reasons(q, cache, fmt):
        from hwrun.kernels.triton.indexer_logits import logits_paged as triton_logits_paged

        return triton_logits_paged(q, weights, cache, fmt, block_table, context_lens, max_ctx)
    return gluon_paged_logits.logits_paged(
        q, weights, cache, fmt, block_table, context_lens, max_ctx
    )


def _sparse_mla_validate(spec: OpSpec) -> list[str]:
    reasons = _gluon_reasons(spec)
    reasons += format_reasons(spec, ("fp8_ds_mla",), "latent")
    reasons += dtype_reasons(spec, ("bfloat16",), "query")
    if spec.head_dim not in (None, 576):
        reasons.append(f"head_dim must be 576 (absorbed MLA), got {spec.head_dim}")
    return reasons


def sparse_mla_decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, 656] uint8
    fmt: str,
    slots: torch.Tensor,  # [B, s, k] int32, -1 invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    latent_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    from hwrun_nvidia import gluon_sparse_mla

    if latent_scale is not None or gluon_sparse_mla.shape_reasons(q, cache, fmt):
        from hwrun.kernels.triton.sparse_mla import decode as triton_decode

        return triton_decode(
            q, cache, fmt, slots, softmax_scale, topk_length, attn_sink, latent_scale
        )
    return gluon_sparse_mla.decode(q, cache, slots, softmax_scale, topk_length, attn_sink)


def _topk_validate(spec: OpSpec) -> list[str]:
    # Nothing in the top-k kernels is Hopper's own, but they were built and tested for it only.
    reasons = _gluon_reasons(spec, "its kernels are built and tested for sm_90 only")
    reasons += dtype_reasons(spec, ("float32",), "logits")
    return reasons


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
) -> torch.Tensor:  # [R, k] int32
    """The Triton top-k with its threshold, compaction and select kernels Gluon's (each stands
    in where its tile fits; topk_threshold.TopkKernels)."""
    from hwrun.kernels.triton.topk_threshold import TopkKernels
    from hwrun.kernels.triton.topk_threshold import topk as triton_topk
    from hwrun_nvidia import gluon_topk

    kernels = TopkKernels(gluon_topk.threshold, gluon_topk.select, gluon_topk.compact)
    return triton_topk(logits, starts, ends, k, kernels=kernels)


def register(registry: OpRegistry) -> None:
    registry.register(
        OpImpl(
            op="indexer.logits_paged",
            name="gluon",
            platform=registry.platform,
            fn=logits_paged,
            graph_safe=True,  # no host reads, allocations by shape only
            validate=_validate,
            priority=15,
            description="Gluon (sm_90) paged logits, mxfp4 or fp8 keys: one K=128 fp8 MMA a page",
        )
    )
    registry.register(
        OpImpl(
            op="sparse_mla.decode",
            name="gluon",
            platform=registry.platform,
            fn=sparse_mla_decode,
            graph_safe=True,  # no host reads, allocations by shape only
            validate=_sparse_mla_validate,
            priority=15,
            description="Gluon (sm_90) sparse MLA decode: a producer warpgroup decodes "
            "fp8_ds_mla tiles into shared memory as bf16 for two warpgroups' MMAs",
        )
    )
    registry.register(
        OpImpl(
            op="indexer.topk",
            name="gluon",
            platform=registry.platform,
            fn=topk,
            graph_safe=True,  # no host reads, allocations by shape only
            validate=_topk_validate,
            priority=15,
            description="the Triton top-k with Gluon (sm_90) threshold, compaction and select "
            "kernels: one barrier a search round, none in the compaction",
        )
    )
