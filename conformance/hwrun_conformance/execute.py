"""Run one case of one impl in this process and judge it. The worker calls this; so can tests.

The reference always runs on CPU copies of the inputs (ground truth); the impl runs on copies on
the platform's device, with in-place outputs inside guard bytes. The verdict is PASS or FAIL plus
the metric that decided it; the runner turns it into the final status (advisory cases, claims,
known failures).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hwrun_conformance import metrics
from hwrun_conformance.case import ACCURACY, BATCH, BATCH_METRIC, PADDING, Case, Check, Sample
from hwrun_conformance.guards import guard_damage, guarded_copy
from hwrun_conformance.tolerances import RELAXATIONS, Relaxation, tolerance_for

Outputs = tuple[dict[str, Any], str | None]  # outputs by name, guard damage (None: intact)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    metric: str
    value: float | None = None
    threshold: float | None = None
    reason: str = ""
    relaxation: str | None = None
    below_quality: bool = False  # passed the limit but not the quality target


def run_case(
    case: Case,
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    platform: str,
    device: str = "cpu",
    relaxations: tuple[Relaxation, ...] = RELAXATIONS,
) -> Verdict:
    try:
        sample = case.build(case.generator())
    except Exception as exc:
        return _suite_error("building the sample", exc)
    if case.kind == ACCURACY:
        return _accuracy(case, sample, fn, reference, platform, device, relaxations)
    if case.kind == PADDING:
        return _padding(case, sample, fn, device)
    if case.kind == BATCH:
        return _batch(case, sample, fn, reference, platform, device, relaxations)
    raise ValueError(f"unknown case kind {case.kind!r}")


def _accuracy(
    case: Case,
    sample: Sample,
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    platform: str,
    device: str,
    relaxations: tuple[Relaxation, ...],
) -> Verdict:
    try:
        ref_out = _call(reference, sample, _copy_args(sample.kwargs, "cpu"))
    except Exception as exc:
        return _suite_error("running the reference", exc)
    outcome = _call_impl(fn, sample, device)
    if isinstance(outcome, Verdict):
        return outcome
    got, damage = outcome
    if damage:
        return Verdict(False, "guard_bytes", None, 0.0, damage)
    return _compare(case, sample, got, ref_out, platform, relaxations)


def _compare(
    case: Case,
    sample: Sample,
    got: dict[str, Any],
    ref_out: dict[str, Any],
    platform: str,
    relaxations: tuple[Relaxation, ...],
) -> Verdict:
    """Every output of ``got`` against the reference's with its check; the first failing check,
    else the one closest to its limit (a quality warning first)."""
    verdicts = []
    for name in sample.outputs:
        check = case.checks[name]
        problem = metrics.structural(got.get(name), ref_out[name])
        if problem:
            return Verdict(False, f"{name}:structure", reason=f"{name}: {problem}")
        key = check.tolerance_key or case.format_key
        tol, relaxed = tolerance_for(platform, case.op, name, key, relaxations)
        context = check.context(sample.kwargs) if check.context else {}
        measured = metrics.METRICS[check.metric](
            got[name], ref_out[name], tol, got_all=got, ref_all=ref_out, **context
        )
        below_quality = tol.quality is not None and measured.value > tol.quality
        detail = f"{name}: {measured.detail}" if measured.detail else ""
        if below_quality and measured.value <= tol.threshold:
            detail = f"{detail}; above the quality target {tol.quality:g}"
        verdict = Verdict(
            passed=measured.value <= tol.threshold,
            metric=f"{name}:{tol.describe(check.metric)}",
            value=measured.value,
            threshold=tol.threshold,
            reason=detail,
            relaxation=relaxed,
            below_quality=below_quality,
        )
        if not verdict.passed:
            return verdict
        verdicts.append(verdict)
    warned = [v for v in verdicts if v.below_quality]
    if warned:
        return warned[0]
    return max(verdicts, key=lambda v: v.value / v.threshold if v.threshold else v.value)


def _padding(case: Case, sample: Sample, fn: Callable[..., Any], device: str) -> Verdict:
    if sample.perturb_padding is None:
        return _suite_error("the padding check", ValueError(f"{case.case_id} has no padding"))
    first = _call_impl(fn, sample, device)
    if isinstance(first, Verdict):
        return first
    generator = torch.Generator().manual_seed(case.seed + 1)
    perturbed = Sample(
        kwargs=sample.perturb_padding(_copy_args(sample.kwargs, "cpu"), generator),
        outputs=sample.outputs,
        inplace=sample.inplace,
        unpack=sample.unpack,
    )
    second = _call_impl(fn, perturbed, device)
    if isinstance(second, Verdict):
        return second
    return _bitwise_same(
        first, second, "padding_invariance", "after changing ignored inputs", case.checks
    )


def _batch(
    case: Case,
    sample: Sample,
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    platform: str,
    device: str,
    relaxations: tuple[Relaxation, ...],
) -> Verdict:
    """Each row subset run alone must first match the reference on those rows (a wrong answer
    at batch 1 is a wrong answer, FAIL whatever is claimed), then equal its rows of the full
    batch bit for bit (metric ``batch_invariance``: FAIL only where the platform claims it)."""
    rows = sample.rows
    if rows is None or sample.inplace:
        return _suite_error("the batch check", ValueError(f"{case.case_id} has no row split"))
    full = _call_impl(fn, sample, device)
    if isinstance(full, Verdict):
        return full
    count = next(sample.kwargs[a].shape[d] for a, d in rows.args.items())
    for chosen in _row_subsets(count):
        kwargs = _copy_args(sample.kwargs, "cpu")
        for arg, dim in rows.args.items():
            kwargs[arg] = kwargs[arg].narrow(dim, chosen[0], len(chosen)).clone()
        alone = Sample(kwargs, sample.outputs, unpack=sample.unpack)
        part = _call_impl(fn, alone, device)
        if isinstance(part, Verdict):
            return _about_rows(part, chosen)
        try:
            ref_out = _call(reference, alone, _copy_args(kwargs, "cpu"))
        except Exception as exc:
            return _suite_error(f"running the reference on rows {_rows(chosen)}", exc)
        accuracy = _compare(case, alone, part[0], ref_out, platform, relaxations)
        if not accuracy.passed:
            return _about_rows(accuracy, chosen)
        expected = {
            name: full[0][name].narrow(dim, chosen[0], len(chosen))
            for name, dim in rows.outputs.items()
        }
        when = f"for rows {_rows(chosen)}"
        verdict = _bitwise_same((expected, full[1]), part, BATCH_METRIC, when, case.checks)
        if not verdict.passed:
            return verdict
    return Verdict(True, BATCH_METRIC, 0.0, 0.0)


def _rows(chosen: list[int]) -> str:
    return f"[{chosen[0]}]" if len(chosen) == 1 else f"[{chosen[0]}..{chosen[-1]}]"


def _about_rows(verdict: Verdict, chosen: list[int]) -> Verdict:
    """A failure of the rows run alone, saying which rows (batch of len(chosen))."""
    where = f"rows {_rows(chosen)} run alone (batch {len(chosen)})"
    return dataclasses.replace(verdict, reason=f"{where}: {verdict.reason}")


def _row_subsets(count: int) -> list[list[int]]:
    subsets = [[0], [count - 1], list(range(count // 2))]
    return [s for s in subsets if s and len(s) < count] or [[0]]


def _bitwise_same(
    a: Outputs, b: Outputs, metric: str, when: str, checks: Mapping[str, Check]
) -> Verdict:
    """Outputs of ``b`` equal to ``a``'s bit for bit, each in its check's canonical form (top-k
    rows sorted: the contract compares them as sets); either call's guard damage fails first."""
    for damage in (a[1], b[1]):
        if damage:
            return Verdict(False, "guard_bytes", None, 0.0, damage)
    for name, tensor in a[0].items():
        canonical = checks[name].canonical if name in checks else None
        mine, theirs = b[0][name], tensor
        if canonical is not None:
            mine, theirs = canonical(mine), canonical(theirs)
        measured = metrics.exact(mine, theirs, metrics.Tolerance())
        if measured.value:
            return Verdict(
                False, metric, measured.value, 0.0, f"{name} changed {when}: {measured.detail}"
            )
    return Verdict(True, metric, 0.0, 0.0)


def _call_impl(fn: Callable[..., Any], sample: Sample, device: str) -> Outputs | Verdict:
    """(outputs by name, guard damage) or a FAIL verdict when the impl raised."""
    kwargs = _copy_args(sample.kwargs, device)
    guards = {}
    for name in sample.inplace:
        # From the original argument, not the copy: a strided cache view keeps its strides.
        guards[name] = guarded_copy(sample.kwargs[name], device, seed=len(name))
        kwargs[name] = guards[name].view
    try:
        outputs = _call(fn, sample, kwargs)
    except Exception as exc:
        last = traceback.format_exception_only(exc)[-1].strip()
        return Verdict(False, "raised", reason=f"the impl raised {last}")
    damage = "; ".join(f"{n}: {d}" for n, g in guards.items() if (d := guard_damage(g)))
    return outputs, damage or None


def _call(fn: Callable[..., Any], sample: Sample, kwargs: dict[str, Any]) -> dict[str, Any]:
    result = fn(**kwargs)
    if sample.unpack is not None:
        result = sample.unpack(result)
    if sample.inplace:
        return {name: kwargs[name].cpu() for name in sample.outputs}
    if isinstance(result, torch.Tensor):
        result = (result,)
    if not isinstance(result, tuple | list) or len(result) != len(sample.outputs):
        raise TypeError(f"expected outputs {sample.outputs}, got {type(result).__name__}")
    return {
        name: value.cpu() if isinstance(value, torch.Tensor) else value
        for name, value in zip(sample.outputs, result, strict=True)
    }


def _copy_args(kwargs: dict[str, Any], device: str) -> dict[str, Any]:
    return {k: _copied(v, device) for k, v in kwargs.items()}


def _copied(value: Any, device: str) -> Any:
    """A copy on ``device`` of a tensor, or of the tensors inside a tuple or a dataclass (a
    QuantizedWeight), so the impl can neither see the reference's inputs nor change them."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, tuple | list):
        return type(value)(_copied(v, device) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _copied(getattr(value, f.name), device)
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    return value


def _suite_error(stage: str, exc: Exception) -> Verdict:
    last = traceback.format_exception_only(exc)[-1].strip()
    return Verdict(False, "suite_error", reason=f"conformance suite error while {stage}: {last}")
