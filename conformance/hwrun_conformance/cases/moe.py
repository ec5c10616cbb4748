"""Cases of the MoE ops: `moe.route`, `moe.experts`, `moe.requant`.

Routing compares expert ids as per-row sets and the weights after aligning both by expert id, so
a kernel may return the k experts in another order. Inputs avoid exact score ties (continuous
random logits): the tie rule of the reference is its own choice, not part of what is compared.
Experts compare with allclose per weight format (the activation rounding is part of the
contract); requant compares the MXFP4 bytes and scales exactly.
"""

from __future__ import annotations

import random

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("moe.route", "moe.experts", "moe.requant")

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


def _experts_sample(
    g, fmt, mode, tokens, experts, hidden, inter, k, shared, given_codes=False
) -> Sample:
    from hwrun.formats.fp8 import quantize_fp8_groups
    from hwrun.ops.quantized_weight import quantize_weight

    def weight(shape, name):
        return quantize_weight(torch.randn(*shape, generator=g) * 0.05, fmt, name)

    ids = torch.empty(tokens, k, dtype=torch.long)
    for t in range(tokens):
        ids[t] = torch.randperm(experts, generator=g)[:k]
    ids[torch.rand(tokens, k, generator=g) < 0.2] = -1  # served by another rank (EP)
    kwargs = {
        "x": torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
        "w13": weight((experts, 2 * inter, hidden), "w13"),
        "w2": weight((experts, hidden, inter), "w2"),
        "ids": ids.to(torch.int32),
        "weights": torch.rand(tokens, k, generator=g),
        "activation_mode": mode,
        "shared_experts": (
            (weight((2 * inter, hidden), "shared_w13"), weight((hidden, inter), "shared_w2"))
            if shared
            else None
        ),
    }
    if given_codes:
        # x's codes and scales as the engine's norm kernel hands them to an MoE: row-major
        codes, scales = quantize_fp8_groups(kwargs["x"].float(), 128, ue8m0=fmt.endswith("ue8m0"))
        kwargs["quantized"] = (codes, scales)
        return Sample(kwargs=kwargs, outputs=("out",))
    return Sample(
        kwargs=kwargs,
        outputs=("out",),
        rows=RowSplit(args={"x": 0, "ids": 0, "weights": 0}, outputs={"out": 0}),
    )


def _experts(
    fmt,
    mode,
    seed,
    tokens=6,
    experts=4,
    hidden=128,
    inter=128,
    k=2,
    shared=False,
    quick=True,
    about="",
    given_codes=False,
) -> list[Case]:
    case = Case(
        op="moe.experts",
        name=f"{fmt}_{mode}"
        + ("_shared" if shared else "")
        + ("_given_codes" if given_codes else ""),
        spec=OpSpec(op="moe.experts", dtype="bfloat16", formats=(fmt, mode), topk=k),
        build=lambda g: _experts_sample(
            g, fmt, mode, tokens, experts, hidden, inter, k, shared, given_codes
        ),
        checks={"out": Check("allclose")},
        seed=seed,
        quick=quick,
        about=about,
    )
    # (a batch split would hand each part all of x's codes)
    return variants(case, batch=tokens > 1 and not given_codes, quick_siblings=fmt == "mxfp4")


def _requant_sample(g, source: str, shape: tuple[int, ...]) -> Sample:
    from hwrun.ops.quantized_weight import quantize_weight

    weight = quantize_weight(torch.randn(*shape, generator=g) * 0.02, source, "w13")
    return Sample(
        kwargs={"weight": weight, "target": "mxfp4"},
        outputs=("data", "scales"),
        unpack=_mxfp4_parts,
    )


def _mxfp4_parts(weight) -> tuple:
    if weight.format != "mxfp4":
        raise TypeError(f"moe.requant returned a {weight.format} weight, expected mxfp4")
    return weight.data, weight.scales


def _requant(source, name, seed, shape, quick=True, about="") -> Case:
    return Case(
        op="moe.requant",
        name=f"{source}_{name}",
        spec=OpSpec(op="moe.requant", formats=(source, "mxfp4")),
        build=lambda g: _requant_sample(g, source, shape),
        checks={"data": Check("exact"), "scales": Check("exact")},
        seed=seed,
        quick=quick,
        about=about,
    )


def cases(op: str) -> list[Case]:
    if op == "moe.experts":
        return [
            *_experts("bf16", "bf16", 411, shared=True, about="bf16 weights, shared experts"),
            *_experts("mxfp4", "a8w4", 412, about="MXFP4 experts, fp8 activations (ROCm)"),
            *_experts("fp8_block128", "bf16", 413, about="fp8 block-128 weights"),
            *_experts("mxfp4", "a4w4", 414, quick=False, about="MXFP4 weights and activations"),
            *_experts("nvfp4", "bf16", 415, quick=False, about="NVFP4 with per-expert scale"),
            *_experts(
                "int4_g128",
                "bf16",
                416,
                about="W4A16: int4 group-128 weights, bf16 activations (PPU)",
            ),
            *_experts("fp8_block128_ue8m0", "bf16", 417, quick=False, about="ue8m0 block scales"),
            *_experts(
                "fp8_block128",
                "a8w8",
                424,
                shared=True,
                about="fp8 block-128 experts, fp8 activations, shared experts too (DeepSeek)",
            ),
            *_experts(
                "fp8_block128_ue8m0", "a8w8", 425, hidden=256, quick=False, about="ue8m0, a8w8"
            ),
            *_experts(
                "fp8_block128",
                "a8w8",
                426,
                shared=True,
                given_codes=True,
                about="a8w8 with x's codes and scales handed over (the engine's norm writes them)",
            ),
            *_experts("mxfp4", "bf16", 418, tokens=0, about="no tokens"),
            *_experts("bf16", "bf16", 419, tokens=1, experts=8, k=4, about="one token"),
            *_experts(
                "mxfp4",
                "a8w4",
                420,
                tokens=300,
                experts=16,
                k=4,
                quick=False,
                about="a large batch: ~75 tokens per expert",
            ),
        ]
    if op == "moe.requant":
        return [
            _requant(
                "fp8_block128",
                "partial_tiles",
                421,
                (2, 200, 96),
                about="R and C not multiples of 128",
            ),
            _requant("fp8_block128_ue8m0", "experts", 422, (3, 128, 256), about="ue8m0 scales"),
            _requant(
                "fp8_block128",
                "layer",
                423,
                (8, 512, 1024),
                quick=False,
                about="a larger expert stack",
            ),
        ]
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
            "batch1_grouped",
            406,
            1,
            64,
            top_k=8,
            scoring="sigmoid",
            n_group=8,
            topk_group=4,
            e_score_correction_bias=True,
            about="one token, grouped sigmoid routing",
        ),
        *_route(
            "tokens_4096",
            407,
            4096,
            256,
            top_k=8,
            scoring="sigmoid",
            n_group=8,
            topk_group=4,
            e_score_correction_bias=True,
            routed_scaling_factor=2.5,
            quick=False,
            about="a large batch with DeepSeek-V3.2's router",
        ),
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


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random MoE case: routing with any expert count, top-k, scoring and grouping; experts
    in any weight format and activation mode; requant of any expert stack shape."""
    if op == "moe.route":
        experts = rng.choice((8, 16, 64, 256))
        options: dict = {"scoring": rng.choice(("softmax", "sigmoid"))}
        if rng.random() < 0.5:
            n_group = rng.choice([g for g in (2, 4, 8) if experts % g == 0])
            options["n_group"] = n_group
            options["topk_group"] = rng.randint(1, n_group)
            eligible = options["topk_group"] * (experts // n_group)
        else:
            eligible = experts
        options["top_k"] = rng.randint(1, min(eligible, 8))
        if rng.random() < 0.5:
            options["e_score_correction_bias"] = True
        options["renormalize"] = rng.random() < 0.7
        options["routed_scaling_factor"] = rng.choice((1.0, 2.5))
        dtype = rng.choice((torch.float32, torch.bfloat16))
        tokens = rng.choice((0, 1, 3, 64, 500))
        about = replayable("*_route", name, seed, tokens, experts, dtype, **options)
        return _route(name, seed, tokens, experts, dtype, about=about, **options)[0]
    if op == "moe.experts":
        fmt, mode = rng.choice(_EXPERT_FORMATS)
        experts = rng.choice((1, 2, 4, 8))
        params = {
            "tokens": rng.choice((0, 1, 5, 40)),
            "experts": experts,
            "hidden": rng.choice((128, 256)),
            "inter": 128,
            "k": rng.randint(1, experts),
            "shared": rng.random() < 0.3,
        }
        about = replayable("*_experts", fmt, mode, seed, **params)
        return _experts(fmt, mode, seed, about=about, **params)[0]
    source = rng.choice(("fp8_block128", "fp8_block128_ue8m0"))
    shape = (rng.randint(1, 4), rng.randint(1, 300), 32 * rng.randint(1, 10))  # C: MX groups of 32
    about = replayable("_requant", source, name, seed, shape)
    return _requant(source, name, seed, shape, about=about)


# (weight format, activation mode) pairs the named cases use.
_EXPERT_FORMATS = (
    ("bf16", "bf16"),
    ("mxfp4", "a8w4"),
    ("mxfp4", "a4w4"),
    ("mxfp4", "bf16"),
    ("fp8_block128", "bf16"),
    ("fp8_block128", "a8w8"),
    ("fp8_block128_ue8m0", "bf16"),
    ("nvfp4", "bf16"),
    ("int4_g128", "bf16"),
)
