"""Cases of `attn.lse_combine`: W partial outputs merged by their natural-log LSE.

Edge cases from the contract: a part with LSE -inf contributes nothing even when its output is
NaN (padding: those outputs may hold anything), a row where every part is empty gives out 0 and
LSE -inf, head counts that are not a multiple of 16, and LSEs far apart (one part dominates).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("attn.lse_combine",)

_ROWS = RowSplit(args={"outs": 1, "lses": 1}, outputs={"out": 0, "lse": 0})


def _sample(
    g: torch.Generator,
    parts: int,
    tokens: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    spread: float,
) -> Sample:
    outs = torch.randn(parts, tokens, heads, dim, generator=g).to(dtype)
    lses = torch.randn(parts, tokens, heads, generator=g) * spread
    empty = torch.rand(parts, tokens, heads, generator=g) < 0.25
    empty[:, 0, 0] = True  # every part empty: out 0, lse -inf
    lses[empty] = float("-inf")
    outs[empty] = float("nan")  # an empty part's output is garbage and must be ignored
    return Sample(
        kwargs={"outs": outs, "lses": lses.float()},
        outputs=("out", "lse"),
        perturb_padding=_perturb_empty_parts,
        rows=_ROWS,
    )


def _perturb_empty_parts(kwargs: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    outs = kwargs["outs"]
    empty = kwargs["lses"] == float("-inf")
    noise = (torch.randn(outs.shape, generator=g) * 1e3).to(outs.dtype)
    kwargs["outs"] = torch.where(empty[..., None], noise, outs)
    return kwargs


def _case(
    name, seed, parts, tokens, heads, dim, dtype, spread=2.0, quick=True, about=""
) -> list[Case]:
    dtype_name = str(dtype).removeprefix("torch.")
    case = Case(
        op="attn.lse_combine",
        name=name,
        spec=OpSpec(op="attn.lse_combine", dtype=dtype_name, num_heads=heads, head_dim=dim),
        build=lambda g: _sample(g, parts, tokens, heads, dim, dtype, spread),
        checks={"out": Check("allclose"), "lse": Check("allclose")},
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(case, padding=True, batch=tokens > 1)


def cases(op: str) -> list[Case]:
    return [
        *_case("dcp2_fp32", 301, 2, 5, 4, 64, torch.float32, about="two parts, empty rows"),
        *_case(
            "dcp4_bf16_h10", 302, 4, 3, 10, 128, torch.bfloat16, about="heads not a multiple of 16"
        ),
        *_case("far_lses", 303, 3, 4, 2, 32, torch.float32, spread=40.0, about="LSEs 100s apart"),
        *_case(
            "models", 304, 8, 4, 128, 512, torch.bfloat16, quick=False, about="W=8, 128 heads x 512"
        ),
        *_case("batch1", 305, 2, 1, 16, 512, torch.bfloat16, about="one token (decode at batch 1)"),
        *_case(
            "rows_640",
            306,
            2,
            40,
            16,
            512,
            torch.float32,
            about="640 rows of 512: several programs on every path",
        ),
        *_case(
            "rows_4400",
            307,
            3,
            1100,
            4,
            64,
            torch.bfloat16,
            quick=False,
            about="a large batch: 4400 rows, the many-rows-per-program path",
        ),
    ]


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random LSE combine: any number of parts, rows, heads, head dim, dtype, LSE spread;
    empty parts (-inf, NaN outputs) everywhere."""
    params = {
        "parts": rng.choice((1, 2, 3, 4, 8)),
        "tokens": rng.choice((1, 2, 7, 40, 300)),
        "heads": rng.choice((1, 4, 10, 16, 64, 128)),
        "dim": rng.choice((32, 64, 128, 512)),
        "dtype": rng.choice((torch.float32, torch.bfloat16)),
        "spread": rng.choice((2.0, 40.0)),
    }
    per_token = params["parts"] * params["heads"] * params["dim"]
    params["tokens"] = max(1, min(params["tokens"], 4_000_000 // per_token))  # <= ~16 MB
    return _case(name, seed, about=replayable("*_case", name, seed, **params), **params)[0]
