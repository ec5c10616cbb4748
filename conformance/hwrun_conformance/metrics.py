"""Metrics by op class. Each returns the number it measured and a sentence about the worst spot.

A metric passes when its value is at most the tolerance's threshold (see
:mod:`hwrun_conformance.tolerances`). Before any metric the runner applies :func:`structural`:
same shape and dtype as the reference, and no NaN where the reference has none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hwrun_conformance.tolerances import Tolerance


@dataclass(frozen=True)
class Measured:
    value: float
    detail: str = ""


def structural(out: Any, ref: torch.Tensor) -> str | None:
    """Why ``out`` cannot be compared with ``ref`` at all, or None."""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor like the reference"
    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != ref.dtype:
        return f"dtype {out.dtype}, expected {ref.dtype}"
    if out.is_floating_point():
        bad = torch.isnan(out.float()) & ~torch.isnan(ref.float())
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            return f"{int(bad.sum())} NaN where the reference has none (first at {where})"
    return None


def exact(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, **_: Any) -> Measured:
    """Bitwise equality of the bytes (formats, cache writes, slot maps): value = bytes differing."""
    a = _bytes(out)
    b = _bytes(ref)
    diff = a != b
    count = int(diff.sum())
    if count == 0:
        return Measured(0.0)
    first = int(diff.nonzero()[0, 0])
    return Measured(
        float(count),
        f"{count} of {a.numel()} bytes differ; first at byte {first} "
        f"(got 0x{int(a[first]):02x}, expected 0x{int(b[first]):02x})",
    )


def allclose(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, **_: Any) -> Measured:
    """Worst ``|out-ref| / (atol + rtol*|ref|)`` over finite reference values; infinities and NaN
    must sit exactly where the reference has them (an empty softmax row has lse = -inf)."""
    return _worst_ratio(out, ref, tol, None)


def allclose_terms(
    out: torch.Tensor,
    ref: torch.Tensor,
    tol: Tolerance,
    *,
    terms: torch.Tensor,  # like ref: each output's sum of |products| (|x| @ |W|^T for a GEMM)
    **_: Any,
) -> Measured:
    """:func:`allclose` with ``tol.terms * terms`` added to each value's allowance: the error a
    sum accumulated at the matrix units' precision may carry, in proportion to the magnitude of
    what it summed rather than to the result (which cancellation can make arbitrarily small)."""
    return _worst_ratio(out, ref, tol, terms)


def _worst_ratio(
    out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, terms: torch.Tensor | None
) -> Measured:
    a = out.detach().float().cpu()
    b = ref.detach().float().cpu()
    mismatch = _nonfinite_mismatch(a, b)
    if mismatch:
        return Measured(float("inf"), mismatch)
    finite = torch.isfinite(b)
    if not bool(finite.any()):
        return Measured(0.0)
    err = (a - b).abs()[finite]
    allowance = tol.atol + tol.rtol * b.abs()[finite]
    if terms is not None:
        size = terms.detach().float().cpu()[finite]
        allowance = allowance + tol.terms * size
    ratio = err / allowance
    worst = int(ratio.argmax())
    where = f"got {float(a[finite][worst]):.6g}, expected {float(b[finite][worst]):.6g}"
    if terms is not None:
        where += f", terms {float(size[worst]):.3g}"
    return Measured(
        float(ratio[worst]),
        f"max |diff| {float(err.max()):.3g}; worst ratio at flat finite index {worst} ({where})",
    )


def logits(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, **_: Any) -> Measured:
    """Indexer logits: -inf (masked) positions exact, then DeepGEMM's calc_diff per row over its
    finite positions, ``1 - 2*sum(a*b) / sum(a*a + b*b)`` (0 when equal; scale-free); the value
    is the worst row's, so one wrong row among thousands is not averaged away."""
    a = out.detach().float().cpu()
    b = ref.detach().float().cpu()
    mismatch = _nonfinite_mismatch(a, b)
    if mismatch:
        return Measured(float("inf"), mismatch)
    width = b.shape[-1] if b.dim() else 1
    finite = torch.isfinite(b).reshape(-1, width)
    a64 = torch.where(finite, a.reshape(-1, width).double(), 0.0)
    b64 = torch.where(finite, b.reshape(-1, width).double(), 0.0)
    denominator = (a64 * a64 + b64 * b64).sum(dim=1)
    product = (a64 * b64).sum(dim=1)
    diff = torch.where(denominator > 0, 1.0 - 2.0 * product / denominator, 0.0).clamp(min=0.0)
    if diff.numel() == 0:
        return Measured(0.0)
    row = int(diff.argmax())
    worst = float(diff[row])
    if worst == 0.0:
        return Measured(0.0)
    bad = int((diff > tol.threshold).sum())
    largest = float((a64[row] - b64[row]).abs().max())
    return Measured(
        worst,
        f"calc_diff {worst:.3g} in row {row} (max |diff| there {largest:.3g}); "
        f"{bad} of {diff.numel()} rows above {tol.threshold:g}",
    )


def index_set(
    out: torch.Tensor,
    ref: torch.Tensor,
    tol: Tolerance,
    *,
    scores: torch.Tensor,  # [R, L] what was ranked
    starts: torch.Tensor,  # [R] first candidate column of each row
    ends: torch.Tensor,  # [R] one past the last candidate column
    **_: Any,
) -> Measured:
    """Top-k with the tie rule: per row, indices (relative to the row's start) are distinct, in
    range, and their scores are the row's k best as a multiset (so each scores at least the k-th
    best and nothing better is left out; which of several tied columns is free); a row of length
    n < k returns exactly 0..n-1 plus k-n entries of -1. Value = rows that break the rule."""
    got = out.detach().cpu().long()
    scores = scores.detach().float().cpu()
    k = got.shape[-1]
    bad_rows = []
    for row in range(got.shape[0]):
        problem = _topk_row_problem(got[row], scores[row], int(starts[row]), int(ends[row]), k)
        if problem:
            bad_rows.append((row, problem))
    if not bad_rows:
        return Measured(0.0)
    row, problem = bad_rows[0]
    return Measured(float(len(bad_rows)), f"{len(bad_rows)} rows wrong; row {row}: {problem}")


def row_sets(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, **_: Any) -> Measured:
    """Each row holds the same values as the reference's, in any order (MoE expert ids).
    Value = rows that differ."""
    a = torch.sort(out.detach().cpu().long(), dim=-1).values
    b = torch.sort(ref.detach().cpu().long(), dim=-1).values
    bad = (a != b).any(dim=-1)
    count = int(bad.sum())
    if count == 0:
        return Measured(0.0)
    row = int(bad.nonzero()[0, 0])
    return Measured(
        float(count), f"{count} rows differ; row {row}: {a[row].tolist()} vs {b[row].tolist()}"
    )


def allclose_by_ids(
    out: torch.Tensor,
    ref: torch.Tensor,
    tol: Tolerance,
    *,
    got_all: dict[str, Any],
    ref_all: dict[str, Any],
    ids: str = "ids",
    **_: Any,
) -> Measured:
    """allclose after putting each row in the order of its own ``ids`` output (MoE weights:
    the same expert may sit at another position when the order differs)."""
    got_ids, ref_ids = got_all.get(ids), ref_all[ids]
    if not isinstance(got_ids, torch.Tensor) or got_ids.shape != ref_ids.shape:
        return Measured(float("inf"), f"cannot align by {ids}: it is missing or misshapen")
    a = out.detach().cpu().gather(-1, torch.argsort(got_ids.cpu().long(), dim=-1, stable=True))
    b = ref.detach().cpu().gather(-1, torch.argsort(ref_ids.cpu().long(), dim=-1, stable=True))
    return allclose(a, b, tol)


def _topk_row_problem(
    got: torch.Tensor, scores: torch.Tensor, start: int, end: int, k: int
) -> str | None:
    length = max(end - start, 0)
    valid = got[got >= 0]
    if int((got < -1).sum()) or int((got >= length).sum()):
        return f"index out of [-1, {length}): {got.tolist()}"
    if valid.numel() != min(k, length):
        return f"{valid.numel()} valid indices, expected {min(k, length)}"
    if valid.unique().numel() != valid.numel():
        return f"duplicate indices {sorted(valid.tolist())}"
    if length <= k:
        return None  # every candidate is in: set equality with 0..n-1 is implied
    row = scores[start:end]
    best = torch.topk(row, k).values  # descending
    picked = torch.sort(row[valid], descending=True).values
    if not torch.equal(picked, best):
        # The first rank where the picked scores fall short names a better column left out.
        rank = int((picked != best).nonzero()[0, 0])
        return (
            f"rank {rank}: picked a column scoring {float(picked[rank]):.6g} while one scoring "
            f"{float(best[rank]):.6g} was left out (k-th best {float(best[-1]):.6g})"
        )
    return None


def _nonfinite_mismatch(a: torch.Tensor, b: torch.Tensor) -> str | None:
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        diff = test(a) != test(b)
        if bool(diff.any()):
            where = tuple(int(i) for i in diff.nonzero()[0])
            count = int(diff.sum())
            return f"{count} positions where {name} differs from the reference (first at {where})"
    return None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


METRICS: dict[str, Callable[..., Measured]] = {
    "exact": exact,
    "allclose": allclose,
    "allclose_terms": allclose_terms,
    "logits": logits,
    "index_set": index_set,
    "row_sets": row_sets,
    "allclose_by_ids": allclose_by_ids,
}
