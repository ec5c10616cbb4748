"""attn.lse_combine: merge W partial attention outputs by their natural-log LSE.

Program p merges BLOCK_P rows of all W parts: a first sweep finds the largest LSE, a second
folds the parts in index order (the reference's order), so a part with LSE -inf adds exactly
nothing and an all-empty row gives out 0, LSE -inf. The optional per-head sink (sparse MLA's
extra denominator logit) scales the merged output by sigmoid(lse - sink), as the op defines.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun import knobs
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel


@triton.jit
def _lse_combine_kernel(
    outs_ptr,  # [W, P, D]
    lses_ptr,  # [W, P] float32
    sink_ptr,  # [H] float32 (unused without HAS_SINK); row p has head p % H
    out_ptr,  # [P, D]
    lse_ptr,  # [P] float32
    W,
    P,
    D,
    H,
    HAS_SINK: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = p < P
    d = tl.arange(0, BLOCK_D)
    mask2 = p_mask[:, None] & (d[None, :] < D)
    top = tl.full((BLOCK_P,), float("-inf"), tl.float32)
    for w in range(0, W):
        top = tl.maximum(top, tl.load(lses_ptr + w * P + p, mask=p_mask, other=float("-inf")))
    empty = top == float("-inf")
    shift = tl.where(empty, 0.0, top)
    total = tl.zeros((BLOCK_P,), tl.float32)
    acc = tl.zeros((BLOCK_P, BLOCK_D), tl.float32)
    for w in range(0, W):
        lse_w = tl.load(lses_ptr + w * P + p, mask=p_mask, other=float("-inf"))
        weight = tl.exp(lse_w - shift)
        part = tl.load(outs_ptr + (w * P + p)[:, None] * D + d[None, :], mask=mask2, other=0.0)
        part = tl.where((lse_w == float("-inf"))[:, None], 0.0, part.to(tl.float32))
        total += weight
        acc += weight[:, None] * part
    safe = tl.where(empty, 1.0, total)
    out = tl.where(empty[:, None], 0.0, acc / safe[:, None])
    lse = tl.where(empty, float("-inf"), shift + tl.log(safe))
    if HAS_SINK:
        sink = tl.load(sink_ptr + p % H, mask=p_mask, other=0.0)
        factor = tl.where(empty, 0.0, 1.0 / (1.0 + tl.exp(sink - tl.where(empty, 0.0, lse))))
        out = out * factor[:, None]
    tl.store(out_ptr + p[:, None] * D + d[None, :], out, mask=mask2)
    tl.store(lse_ptr + p, lse, mask=p_mask)


def combine_parts(
    outs: torch.Tensor,  # [W, ..., H, D] float
    lses: torch.Tensor,  # [W, ..., H] float32
    sink: torch.Tensor | None,  # [H] float32, or None
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., H, D] out_dtype, lse [..., H] float32
    """Merge the parts; with ``sink`` also apply the sink to the merged output."""
    W, D = outs.shape[0], outs.shape[-1]
    P = lses[0].numel()
    H = lses.shape[-1] if lses.dim() > 1 else 1
    out = torch.empty(outs.shape[1:], dtype=out_dtype, device=outs.device)
    lse = torch.empty(lses.shape[1:], dtype=torch.float32, device=outs.device)
    if P == 0 or D == 0:
        return out, lse
    block_d = triton.next_power_of_2(D)
    # Few rows (decode at batch 1): one row per program so every multiprocessor gets work.
    block_p = 1 if P < 4096 else max(1, min(16, 4096 // block_d))
    if knobs.triton_interpret():
        # The interpreter pays per program (~40 ms here), not per element: few wide programs.
        block_p = min(triton.next_power_of_2(P), max(1, 65536 // block_d))
    prepare_launch()
    _lse_combine_kernel[(triton.cdiv(P, block_p),)](
        outs.contiguous(),
        lses.contiguous(),
        sink.float().contiguous() if sink is not None else lses,
        out,
        lse,
        W,
        P,
        D,
        H,
        HAS_SINK=sink is not None,
        BLOCK_P=block_p,
        BLOCK_D=block_d,
        num_warps=4,
        **pdl_options(out.device),
    )
    return out, lse


def lse_combine(
    outs: torch.Tensor,  # [W, ..., D] float32 / bfloat16 / float16
    lses: torch.Tensor,  # [W, ...] float32, natural log, -inf for an empty part
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., D] outs.dtype, lse [...] float32
    if outs.dim() < 2 or lses.shape != outs.shape[:-1] or lses.dtype != torch.float32:
        raise ValueError(
            f"lse_combine: outs must be [W, ..., D] and lses float32 [W, ...]; got outs "
            f"{tuple(outs.shape)}, lses {lses.dtype} {tuple(lses.shape)}"
        )
    if outs.shape[0] == 0:
        raise ValueError("lse_combine needs at least one part (W >= 1)")
    return combine_parts(outs, lses, None, outs.dtype)
