"""Cases of `kda.step` and `kda.chunk` (gated delta rule with per-channel decay).

Inputs follow the contract's conventions: q and k L2-normalized by the caller, g a log-space
decay (<= 0), beta in (0, 1). Edge cases: no initial state (None), T not a multiple of the
chunk, grouped value heads (HV = 2 H), heads not a multiple of 16, bf16 activations.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("kda.step", "kda.chunk")


def _sample(g: torch.Generator, b, t, h, hv, dk, dv, dtype, with_state, **extra) -> Sample:
    def randn(*shape):
        return torch.randn(*shape, generator=g)

    q = F.normalize(randn(b, t, h, dk), dim=-1).to(dtype)
    k = F.normalize(randn(b, t, h, dk), dim=-1).to(dtype)
    v = randn(b, t, hv, dv).to(dtype)
    decay = F.logsigmoid(randn(b, t, hv, dk) + 3.0).to(dtype)  # mostly close to 0 (slow decay)
    beta = torch.sigmoid(randn(b, t, hv)).to(dtype)
    state = randn(b, hv, dk, dv) * 0.1 if with_state else None
    args = {"q": 0, "k": 0, "v": 0, "g": 0, "beta": 0}
    if with_state:
        args["state"] = 0
    return Sample(
        kwargs={"q": q, "k": k, "v": v, "g": decay, "beta": beta, "state": state, **extra},
        outputs=("o", "state"),
        rows=RowSplit(args=args, outputs={"o": 0, "state": 0}),
    )


def _case(
    op,
    name,
    seed,
    b,
    t,
    h,
    hv,
    dk,
    dv,
    dtype=torch.float32,
    with_state=True,
    quick=True,
    about="",
    **extra,
) -> list[Case]:
    dtype_name = str(dtype).removeprefix("torch.")
    case = Case(
        op=op,
        name=name,
        spec=OpSpec(op=op, dtype=dtype_name, num_heads=h, head_dim=dk),
        build=lambda g: _sample(g, b, t, h, hv, dk, dv, dtype, with_state, **extra),
        checks={"o": Check("allclose"), "state": Check("allclose", tolerance_key="float32")},
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(case, batch=b > 1)


def cases(op: str) -> list[Case]:
    if op == "kda.step":
        return [
            *_case(op, "decode", 501, 3, 1, 2, 2, 16, 16, about="one token, initial state"),
            *_case(
                op,
                "no_state_gqa",
                502,
                2,
                4,
                2,
                4,
                16,
                8,
                with_state=False,
                about="state None, HV = 2 H",
            ),
            *_case(
                op,
                "bf16_h6",
                503,
                2,
                3,
                6,
                6,
                32,
                32,
                torch.bfloat16,
                about="bf16, heads not a multiple of 16",
            ),
            *_case(
                op, "k128", 504, 2, 8, 4, 8, 128, 128, quick=False, about="the models' K = V = 128"
            ),
            *_case(op, "batch1", 505, 1, 2, 4, 4, 32, 32, about="one sequence"),
        ]
    return [
        *_case(
            op,
            "ragged_chunks",
            511,
            2,
            37,
            2,
            2,
            16,
            16,
            chunk_size=16,
            about="T = 37 not a multiple of the chunk",
        ),
        *_case(
            op,
            "no_state_gqa",
            512,
            2,
            20,
            1,
            2,
            16,
            8,
            with_state=False,
            chunk_size=8,
            about="state None, HV = 2 H",
        ),
        *_case(
            op,
            "bf16_default_chunk",
            513,
            1,
            70,
            2,
            2,
            32,
            32,
            torch.bfloat16,
            about="bf16, default chunk 64, T = 70",
        ),
        *_case(
            op, "k128", 514, 2, 130, 2, 4, 128, 128, quick=False, about="the models' K = V = 128"
        ),
        *_case(
            op, "batch1", 515, 1, 40, 2, 2, 16, 16, chunk_size=16, about="one sequence, 3 chunks"
        ),
        *_case(
            op,
            "long_520",
            516,
            2,
            520,
            2,
            2,
            32,
            32,
            chunk_size=64,
            quick=False,
            about="T = 520: nine chunks, the state carried across all of them",
        ),
    ]


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random KDA case: any batch, length, head grouping, head dims, dtype, with or without
    an initial state; chunked: any chunk size, lengths not a multiple of it."""
    heads = rng.choice((1, 2, 4, 6))
    params = {
        "b": rng.choice((1, 2, 3)),
        "t": rng.randint(1, 4) if op == "kda.step" else rng.randint(1, 150),
        "h": heads,
        "hv": heads * rng.choice((1, 2)),
        "dk": rng.choice((16, 32, 64)),
        "dv": rng.choice((8, 16, 32)),
        "dtype": rng.choice((torch.float32, torch.bfloat16)),
        "with_state": rng.random() < 0.7,
    }
    if op == "kda.chunk":
        params["chunk_size"] = rng.choice((8, 16, 64))
    return _case(op, name, seed, about=replayable("*_case", op, name, seed, **params), **params)[0]
