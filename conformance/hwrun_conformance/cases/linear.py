"""Cases of `dense.linear` (``x @ decode(W)^T`` over a weight in its storage format) and of
`dense.linear_a8w8` (the same after ``x`` is quantized to e4m3 per token and 128 columns).

Edges from the contract: weight rows and columns that end in partial 128x128 scale tiles, one
token (decode) and none, ue8m0 scales, scale tiles of zero and of extreme magnitude (an e8m0
code of 0 is 2^-127; the large ones keep the output finite), and an fp32 input (the CPU
engine's dtype: the Triton tier refuses it, since it would round it to bf16). Outputs compare
with allclose: the contract fixes the products and the single rounding, not the summation order.
For `dense.linear_a8w8` also activation groups that are all zero (the 1e-4 amax floor) or hold
one outlier thousands of times the rest (the group's scale follows it; its neighbours' do not).
"""

from __future__ import annotations

import random

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("dense.linear", "dense.linear_a8w8")
FORMATS = ("bf16", "fp8_block128", "fp8_block128_ue8m0")
A8W8_FORMATS = ("fp8_block128", "fp8_block128_ue8m0")

_ROWS = RowSplit(args={"x": 0}, outputs={"out": 0})


def _extreme_scales(weight):
    """The same weight with one scale tile zeroed and the others spread over 2^-20..2^4 (e8m0:
    codes 0 (2^-127), 107 and 131), so the tiles' contributions differ by orders of magnitude."""
    from hwrun.ops.quantized_weight import QuantizedWeight

    scales = weight.scales.clone()
    if weight.format == "fp8_block128_ue8m0":
        spread = torch.tensor([0, 107, 131], dtype=torch.uint8)
    else:
        spread = torch.tensor([0.0, 2.0**-20, 2.0**4])
    flat = scales.view(-1)
    flat.copy_(spread[torch.arange(flat.numel()) % spread.numel()])
    return QuantizedWeight(weight.format, weight.shape, weight.data, scales, name=weight.name)


def _uneven_groups(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its first 128-column group zero in every row and, in the next group, one
    outlier 4096 times a typical value (needs 256 columns or more)."""
    x = x.clone()
    x[:, :128] = 0
    x[:, 128 + 5] = 4096.0
    return x


def _terms(kwargs) -> dict:
    """Each output's sum of |products| over the quantized activations and the decoded weight
    (the scale allclose_terms judges a dense.linear_a8w8 output against)."""
    from hwrun.ops.linear import quantize_activations

    x, weight = kwargs["x"], kwargs["weight"]
    xq = quantize_activations(x.cpu(), weight.format)
    return {"terms": xq.abs() @ weight.dequantize().cpu().abs().t()}


def _sample(g, fmt, tokens, rows, cols, dtype, extreme, uneven, given_codes=False) -> Sample:
    from hwrun.formats.fp8 import quantize_fp8_groups
    from hwrun.ops.quantized_weight import quantize_weight

    weight = quantize_weight(torch.randn(rows, cols, generator=g) * 0.05, fmt, "w")
    if extreme:
        weight = _extreme_scales(weight)
    x = torch.randn(tokens, cols, generator=g)
    if uneven:
        x = _uneven_groups(x)
    x = x.to(dtype)
    kwargs = {"x": x, "weight": weight}
    if given_codes:
        # x's codes and scales as the engine's norm kernel hands them over: the scales tokens
        # first (DeepGEMM's layout; dense, so the copy to the device keeps the strides)
        codes, scales = quantize_fp8_groups(x.float(), 128, ue8m0=fmt.endswith("ue8m0"))
        kwargs["quantized"] = (codes, scales.t().contiguous().t())
        return Sample(kwargs=kwargs, outputs=("out",))
    return Sample(kwargs=kwargs, outputs=("out",), rows=_ROWS)


def _case(
    fmt,
    seed,
    tokens,
    rows,
    cols,
    name="",
    dtype=torch.bfloat16,
    extreme=False,
    quick=True,
    about="",
    op="dense.linear",
    uneven=False,
    given_codes=False,
) -> list[Case]:
    dtype_name = str(dtype).removeprefix("torch.")
    case = Case(
        op=op,
        name=name or fmt,
        spec=OpSpec(op=op, dtype=dtype_name, formats=(fmt,)),
        build=lambda g: _sample(g, fmt, tokens, rows, cols, dtype, extreme, uneven, given_codes),
        checks={
            "out": Check("allclose_terms", context=_terms)
            if op == "dense.linear_a8w8"
            else Check("allclose")
        },
        seed=seed,
        quick=quick,
        about=about,
    )
    # (the batch tier splits x's rows only: a case that hands over x's codes stays whole)
    batch = tokens > 1 and not given_codes
    return variants(case, batch=batch, quick_siblings=fmt == "fp8_block128")


def cases(op: str) -> list[Case]:
    return _a8w8_cases() if op == "dense.linear_a8w8" else _linear_cases()


def _a8w8_cases() -> list[Case]:
    op = "dense.linear_a8w8"
    return [
        *_case("fp8_block128", 521, 5, 160, 384, op=op, about="fp32 scales, partial R tile"),
        *_case("fp8_block128_ue8m0", 522, 4, 256, 256, op=op, about="ue8m0 scales on both sides"),
        *_case("fp8_block128", 523, 1, 320, 512, name="one_token", op=op, about="one row"),
        *_case("fp8_block128", 524, 0, 128, 256, name="no_tokens", op=op, about="T = 0"),
        *_case(
            "fp8_block128",
            525,
            4,
            256,
            384,
            name="uneven_groups",
            op=op,
            uneven=True,
            about="a zero activation group (amax floor) and one with a 4096x outlier",
        ),
        *_case(
            "fp8_block128_ue8m0",
            526,
            3,
            256,
            384,
            name="ue8m0_uneven_groups",
            op=op,
            uneven=True,
            about="the same with power-of-two scales",
        ),
        *_case(
            "fp8_block128",
            527,
            4,
            256,
            384,
            name="scale_extremes",
            op=op,
            extreme=True,
            about="weight scale tiles 0, 2^-20 and 2^4",
        ),
        *_case(
            "fp8_block128",
            530,
            21,
            256,
            384,
            name="uneven_groups_21_rows",
            op=op,
            uneven=True,
            about="the uneven groups at 21 rows (a partial 64-row tile; DeepGEMM serves from 16)",
        ),
        *_case(
            "fp8_block128",
            531,
            21,
            256,
            384,
            name="scale_extremes_21_rows",
            op=op,
            extreme=True,
            about="the scale extremes at 21 rows",
        ),
        *_case(
            "fp8_block128",
            532,
            24,
            256,
            384,
            name="given_codes_24_rows",
            op=op,
            uneven=True,
            given_codes=True,
            about="x's codes and scales handed over (quantized=, scales tokens first)",
        ),
        *_case(
            "fp8_block128_ue8m0",
            533,
            4,
            256,
            256,
            name="ue8m0_given_codes",
            op=op,
            given_codes=True,
            about="the same with power-of-two scales, 4 rows",
        ),
        *_case(
            "fp8_block128",
            528,
            64,
            576,
            1536,
            name="decode_64",
            op=op,
            quick=False,
            about="64 rows, R = 576 (kv_a_proj's rows), C = 1536",
        ),
        *_case(
            "fp8_block128",
            529,
            300,
            256,
            512,
            name="prefill_300",
            op=op,
            quick=False,
            about="a prefill chunk of 300 rows",
        ),
    ]


def _linear_cases() -> list[Case]:
    return [
        *_case("bf16", 501, 6, 200, 256, about="bf16 weight; R not a multiple of a tile"),
        *_case("fp8_block128", 502, 5, 160, 384, about="block-FP8, fp32 scales, partial R tile"),
        *_case("fp8_block128_ue8m0", 503, 4, 256, 256, about="block-FP8, ue8m0 scales"),
        *_case(
            "fp8_block128", 504, 3, 96, 200, name="partial_k", about="C = 200: a partial K tile"
        ),
        *_case("fp8_block128", 505, 1, 320, 512, name="one_token", about="one row (decode)"),
        *_case("fp8_block128", 506, 0, 128, 256, name="no_tokens", about="T = 0"),
        *_case(
            "fp8_block128",
            507,
            4,
            256,
            384,
            name="scale_extremes",
            extreme=True,
            about="a zero scale tile, tiles 2^-20 and 2^4",
        ),
        *_case(
            "fp8_block128_ue8m0",
            508,
            4,
            256,
            384,
            name="ue8m0_scale_extremes",
            extreme=True,
            about="e8m0 codes 0 (2^-127), 107 and 131",
        ),
        *_case(
            "fp8_block128",
            509,
            3,
            128,
            256,
            name="fp32_input",
            dtype=torch.float32,
            about="fp32 x (the CPU engine): used as given, fp32 out",
        ),
        *_case(
            "fp8_block128",
            510,
            64,
            576,
            1536,
            name="decode_64",
            quick=False,
            about="64 rows, R = 576 (kv_a_proj's rows), C = 1536",
        ),
        *_case(
            "fp8_block128",
            511,
            300,
            256,
            512,
            name="prefill_300",
            quick=False,
            about="a prefill chunk of 300 rows",
        ),
    ]


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random case: any weight format, rows and columns (partial tiles; a8w8: C a multiple
    of 128), 0 to 70 tokens."""
    a8w8 = op == "dense.linear_a8w8"
    fmt = rng.choice(A8W8_FORMATS if a8w8 else FORMATS)
    params = {
        "tokens": rng.choice((0, 1, 2, 7, 70)),
        "rows": rng.randint(1, 300),
        "cols": 128 * rng.randint(1, 4) if a8w8 else rng.randint(1, 400),
        "name": name,
        "extreme": fmt != "bf16" and rng.random() < 0.2,
    }
    if a8w8:
        params["op"] = op
        params["uneven"] = params["cols"] >= 256 and rng.random() < 0.3
    about = replayable("*_case", fmt, seed, **params)
    return _case(fmt, seed, about=about, **params)[0]
