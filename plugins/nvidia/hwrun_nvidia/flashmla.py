"""FlashMLA adapters: sparse decode (``flash_mla_with_kvcache`` with indices) and sparse prefill
(``flash_mla_sparse_fwd``).

Registered only when ``flash_mla`` can be found. Conventions converted to the contract:
- decode returns the LSE as ``[B, H, s]`` and +inf for a row with no valid entry; the contract
  wants ``[B, s, H]`` and -inf (with out 0).
- decode's ``topk_length`` is refused by the Hopper sparse kernel (an assertion in FlashMLA
  1.0.0's sm90 splitkv_mla.cuh), so the adapter turns the contract's ``[B, s]`` lengths into -1
  entries instead.
- prefill takes indices ``[T, 1, k]``; its LSE is already a natural log in this wheel
  (tokenspeed-flashmla 1.0.0, checked against the reference on the H200).
- sparse decode reads only the fp8_ds_mla cache (656 B rows); q is bf16.
"""

from __future__ import annotations

import torch

from hwrun.registry import OpImpl, OpRegistry, OpSpec, dtype_reasons, format_reasons
from hwrun_nvidia.device_checks import cuda_reasons, importable

FLASHMLA_HEADS = (64, 128)


def _validate(spec: OpSpec, decode: bool) -> list[str]:
    reasons = []
    if not importable("flash_mla"):
        reasons.append("FlashMLA is not installed (pip install tokenspeed-flashmla)")
    reasons += cuda_reasons(spec, min_sm=90)
    reasons += dtype_reasons(spec, ("bfloat16",), "query")
    if decode:
        reasons += format_reasons(spec, ("fp8_ds_mla",), "latent")
    if spec.num_heads is not None and spec.num_heads not in FLASHMLA_HEADS:
        reasons.append(
            f"FlashMLA sparse attention needs {FLASHMLA_HEADS} heads, got {spec.num_heads}"
        )
    if spec.head_dim not in (None, 576):
        reasons.append(f"FlashMLA needs head_dim 576, got {spec.head_dim}")
    if spec.topk is not None and spec.topk % 64:
        reasons.append(f"FlashMLA needs top-k a multiple of 64, got {spec.topk}")
    return reasons


def _empty_rows_to_contract(out: torch.Tensor, lse: torch.Tensor):
    empty = ~torch.isfinite(lse)
    lse = lse.masked_fill(empty, float("-inf"))
    out = out.masked_fill(empty[..., None], 0.0)
    return out, lse


def decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, 656] uint8
    fmt: str,
    slots: torch.Tensor,  # [B, s, k] int32
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
    latent_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512], lse [B, s, H] fp32
    import flash_mla

    if fmt != "fp8_ds_mla" or latent_scale is not None:
        raise ValueError(f"FlashMLA sparse decode reads fp8_ds_mla rows only, got {fmt!r}")
    indices = slots.to(torch.int32)
    if topk_length is not None:
        position = torch.arange(indices.shape[-1], device=q.device)
        indices = indices.masked_fill(position >= topk_length[..., None], -1)
    kv = cache.unsqueeze(2)  # [num_blocks, block_size, 1, 656]
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q.contiguous(),
        kv,
        None,
        None,
        512,
        meta,
        softmax_scale=float(softmax_scale),
        is_fp8_kvcache=True,
        indices=indices.contiguous(),
        attn_sink=None if attn_sink is None else attn_sink.float().contiguous(),
    )
    return _empty_rows_to_contract(out, lse.transpose(1, 2))


def prefill(
    q: torch.Tensor,  # [T, H, 576] bfloat16
    kv: torch.Tensor,  # [S, 576] bfloat16
    indices: torch.Tensor,  # [T, k] int32
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [T] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, H, 512], lse [T, H] fp32 natural log
    import flash_mla

    out, _max_logits, lse = flash_mla.flash_mla_sparse_fwd(
        q.contiguous(),
        kv.to(torch.bfloat16).unsqueeze(1).contiguous(),
        indices.to(torch.int32).unsqueeze(1).contiguous(),
        float(softmax_scale),
        512,
        None if attn_sink is None else attn_sink.float().contiguous(),
        None if topk_length is None else topk_length.to(torch.int32).contiguous(),
    )
    return _empty_rows_to_contract(out.to(q.dtype), lse)


def register(registry: OpRegistry) -> None:
    if not importable("flash_mla"):
        return
    registry.register(
        OpImpl(
            op="sparse_mla.decode",
            name="flashmla",
            platform=registry.platform,
            fn=decode,
            # The tile schedule comes from a device kernel, recomputed every call: captured
            # and replayed in decode graphs (test_adapters_gpu.py checks replay against eager).
            graph_safe=True,
            validate=lambda spec: _validate(spec, decode=True),
            priority=20,
            description="FlashMLA sparse decode (fp8_ds_mla cache, bf16 q)",
        )
    )
    registry.register(
        OpImpl(
            op="sparse_mla.prefill",
            name="flashmla",
            platform=registry.platform,
            fn=prefill,
            validate=lambda spec: _validate(spec, decode=False),
            priority=20,
            description="FlashMLA flash_mla_sparse_fwd (bf16 workspace, bf16 q)",
        )
    )
