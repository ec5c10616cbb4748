"""Reference merge of partial attention results by their log-sum-exp (`attn.lse_combine`).

Split-KV decoding and decode context parallelism (DCP) each attend over part of the keys; the
exact result is the LSE-weighted mix of the parts. The parts are folded in their given order,
one at a time, so a fixed order gives bitwise-identical results on every call.
"""

from __future__ import annotations

import torch

from hwrun.ops.contract import OpContract
from hwrun.registry import OpSpec

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def lse_combine(
    outs: torch.Tensor,  # [W, ..., D] float32 / bfloat16 / float16, one partial output per part
    lses: torch.Tensor,  # [W, ...] float32, natural-log LSE of each part (-inf: empty part)
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., D] in outs.dtype, lse [...] float32
    """Merge ``W`` partial attention outputs into one, exactly.

    ``lse = log(sum_w exp(lses[w]))`` and ``out = sum_w exp(lses[w] - lse) * outs[w]``, in fp32,
    folding the parts in index order. A part whose LSE is -inf contributes nothing (even if its
    output holds NaN); when every part is -inf the result is out 0 and LSE -inf. LSEs are natural
    logs; +inf or NaN LSEs raise ValueError (FlashMLA's +inf for an empty row must be mapped to
    -inf, and its base-2 prefill LSE multiplied by ln 2, before combining).
    """
    if outs.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"outs must be float32, bfloat16 or float16, got {outs.dtype}")
    if lses.dtype != torch.float32:
        raise ValueError(f"lses must be float32, got {lses.dtype}")
    if outs.dim() < 2 or lses.shape != outs.shape[:-1]:
        raise ValueError(
            f"outs must be [W, ..., D] and lses [W, ...] with the same leading dims; got "
            f"outs {list(outs.shape)}, lses {list(lses.shape)}"
        )
    if outs.shape[0] == 0:
        raise ValueError("lse_combine needs at least one part (W >= 1)")
    if bool((lses.isnan() | (lses == float("inf"))).any()):
        raise ValueError("lses must be finite or -inf (an empty part); got +inf or NaN")
    empty = lses == float("-inf")
    lse_max = lses.max(dim=0).values
    all_empty = lse_max == float("-inf")
    shift = torch.where(all_empty, torch.zeros_like(lse_max), lse_max)
    total = torch.zeros_like(lse_max)
    acc = torch.zeros(outs.shape[1:], dtype=torch.float32, device=outs.device)
    for w in range(outs.shape[0]):
        weight = torch.exp(lses[w] - shift)  # exactly 0 for an empty part
        total = total + weight
        part = torch.where(empty[w][..., None], 0.0, outs[w].float())
        acc = acc + weight[..., None] * part
    safe_total = torch.where(all_empty, torch.ones_like(total), total)
    out = torch.where(all_empty[..., None], 0.0, acc / safe_total[..., None])
    lse = torch.where(all_empty, float("-inf"), shift + torch.log(safe_total))
    return out.to(outs.dtype), lse


def _validate(spec: OpSpec) -> list[str]:
    if spec.dtype is not None and spec.dtype not in ("float32", "bfloat16", "float16"):
        return [f"outs must be float32, bfloat16 or float16, got {spec.dtype}"]
    return []


CONTRACTS: list[OpContract] = [
    OpContract(
        name="attn.lse_combine",
        summary="merge partial attention outputs by their natural-log LSE, in a fixed order",
        reference=lse_combine,
        default_spec=OpSpec(op="attn.lse_combine", dtype="bfloat16", num_heads=128, head_dim=512),
        reference_validate=_validate,
    ),
]
