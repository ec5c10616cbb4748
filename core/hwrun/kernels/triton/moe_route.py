"""moe.route as one Triton launch: scores, correction bias, grouped top-k, weights.

A program routes ``BLOCK_T`` tokens. A token's E router logits are held in registers as a
``[G, S]`` tile: the ``n_group`` contiguous groups of ``S = E / n_group`` experts each, both
padded to powers of two (ungrouped routing is one group of E), so a group's top-2 is a
reduction along S and E need not be a power of two. Then, as the reference computes it:

1. scores: softmax or sigmoid of the fp32 logits; ``choice = score + bias`` (selection only);
2. grouped: a group scores the sum of its two best ``choice`` values (its one value when groups
   have a single expert); ``topk_group`` rounds of argmax keep groups, the others' experts
   drop to -inf;
3. ``top_k`` rounds of argmax over the still-open experts: the best ``choice`` and, among
   equal ones, the smallest expert id (the reference's stable sorts); each round's id and its
   unbiased score land in column i of the output, so ids come out in the reference's order;
4. renormalize (sum + 1e-20) and scale.

Every argmax is a max then a min over the lanes that hold it, so ties follow the reference's
rule exactly; a NaN choice ranks first, as torch's descending sort puts it. Divisions round to
nearest (``div_rn``) as torch's do, so a score differs from the reference's only by ``exp``'s
error. Nothing reads a value on the host (no synchronisation: a CUDA graph may capture the
call), and the tile shape depends on E, the groups and k, never on T: every token is computed
the same way whatever the batch (batch-invariant).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun import knobs
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel
from hwrun.ops.moe_route import RENORMALIZE_EPS, route_arg_problems

# A token's padded [G, S] tile lives in registers; past this many lanes (E = 8192 ungrouped)
# the tile no longer fits and the call is refused rather than spilled to local memory.
MAX_EXPERT_LANES = 8192
_NO_LANE: tl.constexpr = tl.constexpr(2147483647)  # above every lane: argmin identity


@triton.jit
def _route_kernel(
    logits_ptr,  # [T, E] float, any strides
    bias_ptr,  # [E] float32 (unused without HAS_BIAS)
    weights_ptr,  # [T, top_k] float32
    ids_ptr,  # [T, top_k] int32
    T,
    stride_t,
    stride_e,
    top_k,
    n_group,  # groups of the tile (1 when ungrouped)
    group_size,  # experts per group (E when ungrouped)
    topk_group,
    scaling,
    eps,
    SOFTMAX: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    g = tl.arange(0, BLOCK_G)
    s = tl.arange(0, BLOCK_S)
    t3 = t[:, None, None]
    g3 = g[None, :, None]
    s3 = s[None, None, :]
    expert = g3 * group_size + s3  # [1, G, S]
    lane = (g3 < n_group) & (s3 < group_size)
    valid = (t3 < T) & lane  # [T, G, S]
    x = tl.load(
        logits_ptr + t3.to(tl.int64) * stride_t + expert * stride_e, mask=valid, other=0.0
    ).to(tl.float32)

    if SOFTMAX:
        x = tl.where(valid, x, float("-inf"))
        top = tl.max(tl.max(x, axis=2), axis=1)
        top = tl.where(t < T, top, 0.0)  # rows past T: no -inf - -inf
        ex = tl.where(valid, tl.exp(x - top[:, None, None]), 0.0)
        total = tl.sum(tl.sum(ex, axis=2), axis=1)
        total = tl.where(t < T, total, 1.0)
        score = tl.math.div_rn(ex, tl.broadcast_to(total[:, None, None], ex.shape))
    else:
        denominator = 1.0 + tl.exp(-x)
        score = tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), denominator)
    choice = score
    if HAS_BIAS:
        choice = score + tl.load(bias_ptr + expert, mask=lane, other=0.0)
    choice = tl.where(choice != choice, float("inf"), choice)  # NaN first, as torch sorts it
    choice = tl.where(valid, choice, float("-inf"))

    if GROUPED:
        first = tl.max(choice, axis=2)  # [T, G]
        at_first = valid & (choice == first[:, :, None])
        first_lane = tl.min(tl.where(at_first, s3, _NO_LANE), axis=2)
        rest = valid & (s3 != first_lane[:, :, None])
        second = tl.max(tl.where(rest, choice, float("-inf")), axis=2)
        group_score = first + tl.where(group_size > 1, second, 0.0)
        group_score = tl.where(group_score != group_score, float("inf"), group_score)
        g2 = g[None, :]
        group_open = tl.where(g2 < n_group, 1, 0) + tl.zeros([BLOCK_T, BLOCK_G], tl.int32)
        keep = tl.zeros([BLOCK_T, BLOCK_G], tl.int32)
        for _round in range(0, topk_group):
            is_open = group_open != 0
            best = tl.max(tl.where(is_open, group_score, float("-inf")), axis=1)
            at_best = is_open & (group_score == best[:, None])
            pick = tl.min(tl.where(at_best, g2, _NO_LANE), axis=1)
            chosen = g2 == pick[:, None]
            keep = tl.where(chosen, 1, keep)
            group_open = tl.where(chosen, 0, group_open)
        choice = tl.where(keep[:, :, None] != 0, choice, float("-inf"))

    k = tl.arange(0, BLOCK_K)[None, :]
    out_ids = tl.zeros([BLOCK_T, BLOCK_K], tl.int32)
    out_weights = tl.zeros([BLOCK_T, BLOCK_K], tl.float32)
    taken = tl.zeros([BLOCK_T, BLOCK_G, BLOCK_S], tl.int32)
    for i in range(0, top_k):
        is_open = valid & (taken == 0)
        best = tl.max(tl.max(tl.where(is_open, choice, float("-inf")), axis=2), axis=1)
        at_best = is_open & (choice == best[:, None, None])
        pick = tl.min(tl.min(tl.where(at_best, expert, _NO_LANE), axis=2), axis=1)
        hit = expert == pick[:, None, None]
        taken = tl.where(hit, 1, taken)
        weight = tl.sum(tl.sum(tl.where(hit & valid, score, 0.0), axis=2), axis=1)
        out_ids = tl.where(k == i, pick[:, None], out_ids)
        out_weights = tl.where(k == i, weight[:, None], out_weights)

    if RENORMALIZE:
        total = tl.broadcast_to((tl.sum(out_weights, axis=1) + eps)[:, None], out_weights.shape)
        out_weights = tl.math.div_rn(out_weights, total)
    out_weights = out_weights * scaling
    out = t[:, None].to(tl.int64) * top_k + k
    mask = (t[:, None] < T) & (k < top_k)
    tl.store(ids_ptr + out, out_ids, mask=mask)
    tl.store(weights_ptr + out, out_weights, mask=mask)


def route(
    router_logits: torch.Tensor,  # [T, E] float32 / bfloat16 / float16
    top_k: int,
    scoring: str = "softmax",
    n_group: int | None = None,
    topk_group: int | None = None,
    e_score_correction_bias: torch.Tensor | None = None,  # [E] float
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # weights [T, k] float32, ids [T, k] int32
    """``moe.route`` (see :func:`hwrun.ops.moe_route.route`) in one launch.

    Shapes and options are checked as the reference checks them; logit values are not (a NaN
    is the reference's to diagnose: it reads the logits on the host).

    :raises ValueError: what the reference raises for shapes and options, and a padded expert
        tile of more than :data:`MAX_EXPERT_LANES` lanes.
    """
    bias = e_score_correction_bias
    problems = route_arg_problems(router_logits, top_k, scoring, n_group, topk_group, bias)
    if problems:
        raise ValueError("moe.route: " + "; ".join(problems))
    num_tokens, num_experts = router_logits.shape
    grouped = n_group is not None and topk_group is not None and topk_group < n_group
    groups = n_group if grouped else 1
    group_size = num_experts // groups
    block_g, block_s = triton.next_power_of_2(groups), triton.next_power_of_2(group_size)
    lanes = block_g * block_s
    if lanes > MAX_EXPERT_LANES:
        raise ValueError(
            f"moe.route: E = {num_experts} experts in {groups} group(s) take a {block_g} x "
            f"{block_s} register tile, over the kernel's {MAX_EXPERT_LANES} lanes; the torch "
            "tier or the reference serves this router"
        )
    device = router_logits.device
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=device)
    if num_tokens == 0:
        return weights, ids
    if bias is not None:
        bias = bias.to(device=device, dtype=torch.float32).contiguous()
    # One token per program on a GPU (decode's 64 tokens: 64 programs, one warp each, every
    # argmax a few warp shuffles). The interpreter pays per program, not per lane: many tokens.
    block_t = max(1, min(64, 8192 // lanes)) if knobs.triton_interpret() else 1
    prepare_launch()
    _route_kernel[(triton.cdiv(num_tokens, block_t),)](
        router_logits,
        bias if bias is not None else weights,
        weights,
        ids,
        num_tokens,
        router_logits.stride(0),
        router_logits.stride(1),
        top_k,
        groups,
        group_size,
        topk_group if grouped else 1,
        float(routed_scaling_factor),
        RENORMALIZE_EPS,
        SOFTMAX=scoring == "softmax",
        HAS_BIAS=bias is not None,
        GROUPED=grouped,
        RENORMALIZE=bool(renormalize),
        BLOCK_T=block_t,
        BLOCK_G=block_g,
        BLOCK_S=block_s,
        BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=1 if lanes <= 512 else 4,
        **pdl_options(router_logits.device),
    )
    return weights, ids
