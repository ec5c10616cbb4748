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

Per call, the decode adapter issues FlashMLA's kernel and one small Triton launch (LSE to the
contract's layout, empty rows zeroed in place). Its tile schedule depends only on the shapes
(batch, query rows, heads, page size, top-k: the adapter never passes ``topk_length``), so one
schedule per shape is kept and reused; computing it on every call cost 30 us per layer on the
H200, a quarter of the decode kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel
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


# FlashMLA's schedule per (device, batch, query rows, heads, page size, top-k): computed by its
# first call, then reused (it holds device tensors; a captured graph replays with them).
_SCHEDULES: dict[tuple, object] = {}


def _schedule(flash_mla, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor):
    key = (q.device, *q.shape[:3], kv.shape[1], indices.shape[-1])
    if key not in _SCHEDULES:
        if torch.cuda.is_current_stream_capturing():
            # Computed inside the graph being captured: its tensors hold nothing until a
            # replay, so it is not kept for eager calls; the graph recomputes it each replay.
            return flash_mla.get_mla_metadata()[0]
        _SCHEDULES[key] = flash_mla.get_mla_metadata()[0]
    return _SCHEDULES[key]


@triton.jit
def _lse_to_contract(
    out_ptr,  # [B, s, H, D] bf16, zeroed in place where the row attended nothing
    lse_ptr,  # [B, H, s] fp32, FlashMLA's layout (+inf: nothing attended)
    lse_out_ptr,  # [B, s, H] fp32
    S,
    H,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    bs = tl.program_id(0)  # (b, s) in the contract's order; its H heads together
    s = bs % S
    b = bs // S
    h = tl.arange(0, BLOCK_H)
    live = h < H
    lse = tl.load(lse_ptr + (b * H + h) * S + s, mask=live, other=0.0)
    empty = live & ((lse != lse) | (tl.abs(lse) == float("inf")))
    tl.store(lse_out_ptr + bs * H + h, tl.where(empty, float("-inf"), lse), mask=live)
    if tl.sum(empty.to(tl.int32)) > 0:  # rare: a row with no valid entry
        rows = (bs * H + h).to(tl.int64)
        zero = tl.zeros((BLOCK_H, BLOCK_D), tl.float32).to(out_ptr.dtype.element_ty)
        for d in range(0, D, BLOCK_D):
            cols = d + tl.arange(0, BLOCK_D)
            mask = empty[:, None] & (cols < D)[None, :]
            tl.store(out_ptr + rows[:, None] * D + cols[None, :], zero, mask=mask)


def lse_to_contract(
    out: torch.Tensor,  # [B, s, H, D] contiguous, rows that attended nothing zeroed in place
    lse: torch.Tensor,  # [B, H, s] float32, FlashMLA's (+inf or NaN: nothing attended)
) -> torch.Tensor:  # [B, s, H] float32, -inf where nothing was attended
    """One program per (b, s), its heads as one vector: one program per (b, s, h) took 3.3 us a
    layer at 64 x 64 heads on the H200, for 16 KB."""
    batch, s, heads, width = out.shape
    lse_out = torch.empty(batch, s, heads, dtype=torch.float32, device=out.device)
    block_d = min(64, triton.next_power_of_2(width))
    _lse_to_contract[(batch * s,)](
        out, lse.contiguous(), lse_out, s, heads, D=width,
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=block_d, **pdl_options(out.device),
    )  # fmt: skip
    return lse_out


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
    out, lse = flash_mla.flash_mla_with_kvcache(
        q.contiguous(),
        kv,
        None,
        None,
        512,
        _schedule(flash_mla, q, kv, indices),
        softmax_scale=float(softmax_scale),
        is_fp8_kvcache=True,
        indices=indices.contiguous(),
        attn_sink=None if attn_sink is None else attn_sink.float().contiguous(),
    )
    out = out.contiguous()  # lse_to_contract zeroes rows of a contiguous [B, s, H, D]
    return out, lse_to_contract(out, lse)


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
    # Rows that attended nothing, to the contract (lse -inf, out 0) in place, as decode does: two
    # masked_fills into new [T, H, 512] tensors took ~0.7 ms a layer at 8192 tokens on the H200.
    out = out.to(q.dtype).contiguous()
    lse_out = lse_to_contract(out.unsqueeze(1), lse.unsqueeze(-1))
    return out, lse_out.squeeze(1)


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
