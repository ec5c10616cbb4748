"""Reference of ``moe.route``: router logits to the top-k experts of every token and their weights.

Semantics follow DeepSeek-V3's router (and vLLM's ``grouped_topk``): scores are the softmax or the
sigmoid of the fp32 logits; experts are *chosen* on the scores plus the optional correction bias,
within the ``topk_group`` best groups when grouped; the returned weights are the *unbiased* scores
of the chosen experts, renormalized and scaled.

Tie rule (fixed here so the result is reproducible and batch-invariant): every selection is a
stable descending sort, so among equal scores the smaller index wins, for groups and for
experts alike. Ids come out ordered by descending biased score, ties by ascending expert id.
"""

from __future__ import annotations

import torch

ROUTE_SCORINGS: tuple[str, ...] = ("softmax", "sigmoid")

# Added to the renormalization denominator, as in DeepSeek-V3's reference router: a row whose
# chosen sigmoid scores all underflow to 0 gets zero weights instead of NaN.
RENORMALIZE_EPS = 1e-20


def route(
    router_logits: torch.Tensor,  # [T, E] float (any float dtype; scored in fp32)
    top_k: int,
    scoring: str = "softmax",
    n_group: int | None = None,
    topk_group: int | None = None,
    e_score_correction_bias: torch.Tensor | None = None,  # [E] float
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # weights [T, k] float32, ids [T, k] int32
    """Choose ``top_k`` experts per token.

    1. ``scores = softmax(logits)`` or ``sigmoid(logits)`` in fp32, over the E experts.
    2. ``choice = scores + e_score_correction_bias`` (the bias steers selection only).
    3. Grouped (``n_group`` and ``topk_group`` both given): the E experts form ``n_group``
       contiguous groups; a group's score is the sum of its top-2 ``choice`` values (its one
       value when groups have a single expert); only experts of the ``topk_group`` best groups
       stay eligible.
    4. ``ids`` = the ``top_k`` eligible experts with the highest ``choice``.
    5. ``weights = scores[ids]``; if ``renormalize``, divided by their sum (+1e-20); then times
       ``routed_scaling_factor``.

    Ties: the smaller group index, then the smaller expert id, wins (stable sorts). T = 0 gives
    empty ``[0, top_k]`` outputs.

    :raises ValueError: a shape, count or option that does not fit, naming what was expected.
    """
    _check_route_args(router_logits, top_k, scoring, n_group, topk_group, e_score_correction_bias)
    return route_unchecked(
        router_logits,
        top_k,
        scoring,
        n_group,
        topk_group,
        e_score_correction_bias,
        renormalize,
        routed_scaling_factor,
    )


def route_unchecked(
    router_logits: torch.Tensor,  # [T, E] float
    top_k: int,
    scoring: str = "softmax",
    n_group: int | None = None,
    topk_group: int | None = None,
    e_score_correction_bias: torch.Tensor | None = None,  # [E] float
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # weights [T, k] float32, ids [T, k] int32
    """The computation of :func:`route` without its argument checks (one of which, the NaN
    check, reads the logits on the host): for callers that must not synchronise (a CUDA graph)."""
    logits = router_logits.float()
    num_tokens, num_experts = logits.shape
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)

    choice = scores
    if e_score_correction_bias is not None:
        choice = scores + e_score_correction_bias.to(device=scores.device, dtype=torch.float32)

    if n_group is not None and topk_group is not None and topk_group < n_group:
        group_size = num_experts // n_group
        grouped = choice.view(num_tokens, n_group, group_size)
        top2 = torch.sort(grouped, dim=-1, descending=True).values[..., : min(2, group_size)]
        group_scores = top2.sum(dim=-1)  # [T, n_group]
        best_groups = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, best_groups[:, :topk_group], True)
        eligible = keep.unsqueeze(-1).expand(-1, -1, group_size).reshape(num_tokens, num_experts)
        choice = choice.masked_fill(~eligible, float("-inf"))

    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORMALIZE_EPS)
    weights = weights * routed_scaling_factor
    return weights.to(torch.float32), ids.to(torch.int32)


def route_arg_problems(
    router_logits: torch.Tensor,  # [T, E] float
    top_k: int,
    scoring: str,
    n_group: int | None,
    topk_group: int | None,
    bias: torch.Tensor | None,  # [E] float
) -> list[str]:
    """Every reason the arguments' shapes, counts and options cannot be routed (empty: they
    can). Reads no tensor values, so a kernel's host function may call it inside a CUDA graph."""
    if router_logits.dim() != 2 or not router_logits.is_floating_point():
        return [
            "router_logits must be a float tensor [T, E], got "
            f"{router_logits.dtype} of shape {list(router_logits.shape)}"
        ]
    num_experts = router_logits.shape[1]
    problems = []
    if num_experts < 1:
        problems.append("router_logits has E = 0 experts; it must be [T, E] with E >= 1")
    if not 1 <= top_k <= num_experts:
        problems.append(f"top_k must be in 1..E = 1..{num_experts}, got {top_k}")
    if scoring not in ROUTE_SCORINGS:
        problems.append(f"scoring must be one of {list(ROUTE_SCORINGS)}, got {scoring!r}")
    if (n_group is None) != (topk_group is None):
        problems.append(
            f"n_group and topk_group go together (got n_group={n_group}, "
            f"topk_group={topk_group}); pass both for grouped top-k or neither"
        )
    elif n_group is not None and topk_group is not None:
        if n_group < 1 or num_experts % n_group:
            problems.append(f"n_group must divide E = {num_experts}, got {n_group}")
        elif not 1 <= topk_group <= n_group:
            problems.append(f"topk_group must be in 1..n_group = 1..{n_group}, got {topk_group}")
        elif top_k > topk_group * (num_experts // n_group):
            problems.append(
                f"top_k = {top_k} exceeds the {topk_group * (num_experts // n_group)} experts "
                f"of topk_group = {topk_group} groups of {num_experts // n_group}; raise "
                "topk_group or lower top_k"
            )
    if bias is not None and (tuple(bias.shape) != (num_experts,) or not bias.is_floating_point()):
        problems.append(
            f"e_score_correction_bias must be a float tensor [E] = [{num_experts}], got "
            f"{bias.dtype} of shape {list(bias.shape)}"
        )
    return problems


def _check_route_args(
    router_logits: torch.Tensor,
    top_k: int,
    scoring: str,
    n_group: int | None,
    topk_group: int | None,
    bias: torch.Tensor | None,
) -> None:
    """Every reason the arguments cannot be routed, raised at once (a NaN logit included)."""
    problems = route_arg_problems(router_logits, top_k, scoring, n_group, topk_group, bias)
    if not problems and torch.isnan(router_logits).any():
        problems.append("router_logits contains NaN; the router produced invalid scores")
    if problems:
        raise ValueError("moe.route: " + "; ".join(problems))
