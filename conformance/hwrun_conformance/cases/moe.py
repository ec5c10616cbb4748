"""Cases of the MoE ops: `moe.route` (more join as their references land).

Routing compares expert ids as per-row sets and the weights after aligning both by expert id, so
a kernel may return the k experts in another order. Inputs avoid exact score ties (continuous
random logits): the tie rule of the reference is its own choice, not part of what is compared.
"""

from __future__ import annotations

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants

OPS = ("moe.route",)

_ROUTE_ROWS = RowSplit(args={"router_logits": 0}, outputs={"weights": 0, "ids": 0})
_ROUTE_CHECKS = {"weights": Check("allclose_by_ids"), "ids": Check("row_sets")}


def _route_sample(
    g: torch.Generator, tokens: int, experts: int, dtype: torch.dtype, **options
) -> Sample:
    logits = (torch.randn(tokens, experts, generator=g) * 2).to(dtype)
    kwargs = {"router_logits": logits, **options}
    if options.get("e_score_correction_bias") is True:
        kwargs["e_score_correction_bias"] = torch.rand(experts, generator=g) * 0.1
    return Sample(kwargs=kwargs, outputs=("weights", "ids"), rows=_ROUTE_ROWS)


def _route(
    name, seed, tokens, experts, dtype=torch.float32, quick=True, about="", **options
) -> list[Case]:
    dtype_name = str(dtype).removeprefix("torch.")
    case = Case(
        op="moe.route",
        name=name,
        spec=OpSpec(op="moe.route", dtype=dtype_name, topk=options["top_k"]),
        build=lambda g: _route_sample(g, tokens, experts, dtype, **options),
        checks=_ROUTE_CHECKS,
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(case, batch=tokens > 1)


def cases(op: str) -> list[Case]:
    return [
        *_route("softmax_top2", 401, 9, 16, top_k=2, about="Mixtral-style softmax routing"),
        *_route(
            "deepseek_grouped",
            402,
            7,
            64,
            top_k=8,
            scoring="sigmoid",
            n_group=8,
            topk_group=4,
            e_score_correction_bias=True,
            routed_scaling_factor=2.5,
            about="sigmoid, 8 groups keep 4, correction bias, routed scaling",
        ),
        *_route(
            "bf16_no_renorm",
            403,
            5,
            32,
            torch.bfloat16,
            top_k=4,
            renormalize=False,
            about="bf16 logits, raw weights",
        ),
        *_route("no_tokens", 404, 0, 16, top_k=2, about="T = 0 gives empty outputs"),
        *_route(
            "deepseek_256",
            405,
            64,
            256,
            top_k=8,
            scoring="sigmoid",
            n_group=8,
            topk_group=4,
            e_score_correction_bias=True,
            routed_scaling_factor=2.5,
            quick=False,
            about="DeepSeek-V3.2's router shape",
        ),
    ]
