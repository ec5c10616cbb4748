"""Tolerances: one table per op and format, and the named relaxations vendors may claim.

Every metric returns one number and passes when it is at most the threshold. For ``allclose`` the
number is the worst ``|out - ref| / (atol + rtol * |ref|)``, so its threshold is 1 and the table
carries atol and rtol. A row may also set a quality target below the threshold: a kernel that
computes in fp32 and rounds its output once lands well under it (half a bf16 ulp is a ratio
near 0.2 at these atol/rtol), one that rounds intermediates lands between target and limit and
is reported as QUALITY_WARNING (conformant, but worth a look). A relaxation loosens one
(platform, op, output, format) row and must say why; reports print the reason next to every
case it touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Tolerance:
    """``threshold``: the conformance limit. ``quality``: a tighter target (as the Khronos CTS's
    QualityWarning): a value between the two passes as QUALITY_WARNING."""

    threshold: float = 0.0
    atol: float = 0.0  # allclose only
    rtol: float = 0.0  # allclose only
    quality: float | None = None
    # allclose_terms only: the error allowed per unit of an output's terms, sum |x_k * w_k|
    terms: float = 0.0

    def describe(self, metric: str) -> str:
        if metric == "allclose_terms":
            return f"{metric}(atol={self.atol:g}, rtol={self.rtol:g}, terms={self.terms:g})"
        if metric.startswith("allclose"):
            return f"{metric}(atol={self.atol:g}, rtol={self.rtol:g})"
        return metric


EXACT = Tolerance(0.0)


@dataclass(frozen=True)
class Relaxation:
    """A looser tolerance for one platform, with the reason it is acceptable."""

    platform: str
    op: str  # glob over op names
    output: str  # glob over output names
    key: str  # glob over format / dtype keys
    tolerance: Tolerance
    reason: str


# (op glob, output glob, format/dtype glob) -> tolerance; the first matching row wins, so specific
# rows come before general ones. Exact ops (cache writes, top-k, slot maps) need no row: their
# metrics count mismatches and pass only at 0.
Q = 0.5  # quality target of the allclose rows (ratio), see the module docstring

TABLE: tuple[tuple[str, str, str, Tolerance], ...] = (
    # Indexer logits: calc_diff (1 - cosine-like similarity) over the finite positions; the
    # reference accumulates in fp32 from the same decoded keys, so only summation order differs.
    ("indexer.logits_*", "*", "*", Tolerance(1e-5, quality=1e-7)),
    # Sparse MLA: bf16 output of a softmax-weighted sum over up to a few thousand rows.
    ("sparse_mla.*", "lse", "*", Tolerance(1.0, atol=1e-3, rtol=1e-3, quality=Q)),
    ("sparse_mla.*", "*", "*", Tolerance(1.0, atol=1e-2, rtol=1e-2, quality=Q)),
    ("attn.lse_combine", "lse", "*", Tolerance(1.0, atol=1e-5, rtol=1e-5, quality=Q)),
    ("attn.lse_combine", "*", "bfloat16", Tolerance(1.0, atol=1e-2, rtol=1e-2, quality=Q)),
    ("attn.lse_combine", "*", "*", Tolerance(1.0, atol=1e-5, rtol=1e-5, quality=Q)),
    ("moe.route", "*", "*", Tolerance(1.0, atol=1e-5, rtol=1e-5, quality=Q)),
    # Expert matmuls: dequantized weights are exact; activations in bf16 round differently.
    ("moe.experts", "*", "*", Tolerance(1.0, atol=2e-2, rtol=2e-2, quality=Q)),
    # Dense linears: exact products, fp32 sums in another order, one rounding to x's dtype.
    ("dense.linear", "*", "*", Tolerance(1.0, atol=1e-2, rtol=1e-2, quality=Q)),
    # The same after x's e4m3 quantization, which a kernel must reproduce exactly (its codes and
    # scales are the reference's); then the sums' order and the scales' products differ, and
    # the precision of the 128-wide K step sums: Hopper's fp8 tensor cores keep about 14 bits
    # of the running sum (DeepSeek-V3 report, 3.3.2), and a kernel that promotes to fp32 once
    # per 128 columns (DeepGEMM's fp8_gemm_nt, DeepSeek's production numerics) is off by ~2^-14
    # of the terms per addition, 2^-10 for 16 of them. An output that cancels terms thousands
    # of times its size (the scale_extremes cases) is judged against its terms (allclose_terms);
    # a wrong scale or code is off by the size of the terms themselves, and still fails.
    ("dense.linear_a8w8", "*", "*", Tolerance(1.0, atol=1e-2, rtol=1e-2, terms=2**-10, quality=Q)),
    ("kda.*", "*", "bfloat16", Tolerance(1.0, atol=2e-2, rtol=2e-2, quality=Q)),
    ("kda.*", "*", "*", Tolerance(1.0, atol=1e-4, rtol=1e-4, quality=Q)),
    ("*", "*", "*", EXACT),
)

# Vendor relaxations. Add a row with the reason; docs/conformance.md says when one is acceptable.
RELAXATIONS: tuple[Relaxation, ...] = ()


def tolerance_for(
    platform: str,
    op: str,
    output: str,
    key: str,
    relaxations: tuple[Relaxation, ...] = RELAXATIONS,
) -> tuple[Tolerance, str | None]:
    """The tolerance of one check, and the relaxation's reason when one applies."""
    for relax in relaxations:
        if relax.platform == platform and _match(
            relax.op, relax.output, relax.key, op, output, key
        ):
            return relax.tolerance, relax.reason
    for op_glob, output_glob, key_glob, tolerance in TABLE:
        if _match(op_glob, output_glob, key_glob, op, output, key):
            return tolerance, None
    raise LookupError(f"no tolerance row matches {op}/{output}/{key}")  # the "*" row always does


def _match(op_glob: str, output_glob: str, key_glob: str, op: str, output: str, key: str) -> bool:
    return (
        fnmatchcase(op, op_glob) and fnmatchcase(output, output_glob) and fnmatchcase(key, key_glob)
    )
