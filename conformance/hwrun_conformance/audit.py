"""Capability audit: what a platform claims (``hwrun_capabilities``) against what its cases show.

A claim the cases do not bear out is a FAIL row: a claimed op with no impl or with every case
refused, a claimed format that no implemented op accepts. Something that works without being
claimed is a PASS row whose reason says so, so the vendor can add the claim. A claimed op whose
cases fail is already FAIL case by case; batch invariance is judged by its BATCH cases.
"""

from __future__ import annotations

from collections import defaultdict
from fnmatch import fnmatchcase

from hwrun.platform import Capabilities
from hwrun.plugins import PluginSet
from hwrun_conformance.case import ACCURACY, BATCH
from hwrun_conformance.result import UNCOVERED, Result, claims_batch_invariance
from hwrun_conformance.status import Status

AUDIT_OP = "capabilities"
# Refused cases say nothing about a claim; known failures are judged by their own entries.
_UNJUDGED = frozenset({Status.NOT_SUPPORTED, Status.KNOWN_FAILURE})
_GOOD = frozenset({Status.PASS, Status.QUALITY_WARNING})  # a claim holds on conformant results


def audit(
    plugins: PluginSet, platform: str, claims: Capabilities, results: list[Result], ops_glob: str
) -> list[Result]:
    rows: list[Result] = []

    def row(item: str, ok: bool, reason: str) -> None:
        rows.append(
            Result(
                platform=platform,
                op=AUDIT_OP,
                case=item,
                status=Status.PASS if ok else Status.FAIL,
                metric="claim",
                reason=reason,
            )
        )

    by_op: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        if result.kind != UNCOVERED:  # a gap in the suite says nothing about the platform
            by_op[result.op].append(result)
    gaps = {r.op for r in results if r.kind == UNCOVERED}
    registry = plugins.registry(platform)

    for op in sorted(by_op):
        op_results = by_op[op]
        ran = [r for r in op_results if r.status not in _UNJUDGED and r.kind == ACCURACY]
        passing = bool(ran) and all(r.status in _GOOD for r in ran)
        if op in claims.ops:
            if not registry.impls(op):
                row(f"ops:{op}", False, f"claims {op} but registers no impl of it")
            elif not ran:
                row(f"ops:{op}", False, f"claims {op} but its impls refuse every case")
            else:
                row(f"ops:{op}", passing, "claimed and " + ("passing" if passing else "failing"))
        elif passing:
            row(f"ops:{op}", True, f"{op} passes but is not claimed: add it to hwrun_capabilities")
    for op in sorted(claims.ops):
        if op not in by_op and op not in gaps and fnmatchcase(op, ops_glob):
            row(f"ops:{op}", False, f"claims {op}, which is not in this hwrun's catalogue")

    formats_ran: dict[str, bool] = {}
    for result in results:
        if result.kind != ACCURACY or result.status in _UNJUDGED or not result.impl:
            continue
        for fmt in result.formats:
            formats_ran[fmt] = formats_ran.get(fmt, True) and result.status in _GOOD
    # Only formats that cases of the selected ops the platform implements use can be judged:
    # with --ops 'sparse_mla.*' (or in quick mode, without an op's case in that format) an
    # index-key format claim says nothing either way. A format claim names no op, so under an
    # --ops filter "no op runs it" cannot be told from "an op outside the filter runs it"
    # (--ops 'moe.*' on a platform that claims mxfp4 for its index keys): only a case that ran
    # in the format and failed judges it then.
    in_scope = {fmt for r in results if r.impl or r.refusals for fmt in r.formats}
    whole_catalogue = ops_glob == "*"
    for fmt in sorted(claims.formats):
        if fmt in formats_ran:
            ok = formats_ran[fmt]
            row(f"formats:{fmt}", ok, "claimed and " + ("passing" if ok else "failing"))
        elif whole_catalogue and fmt in in_scope and any(r.impl for r in results):
            row(f"formats:{fmt}", False, f"claims {fmt} but no implemented op runs a case in it")
    for fmt, ok in sorted(formats_ran.items()):
        if ok and fmt not in claims.formats:
            row(f"formats:{fmt}", True, f"{fmt} passes but is not claimed")

    # Per op: with an impl, a NOT_SUPPORTED batch case means "varies with the batch" (the
    # platform does not claim it there); known failures are judged by their entries.
    for op in sorted(by_op):
        batch = [
            r for r in by_op[op] if r.kind == BATCH and r.impl and r.status != Status.KNOWN_FAILURE
        ]
        if not batch:
            continue
        invariant = all(r.status == Status.PASS for r in batch)
        item = f"batch_invariant:{op}"
        if claims_batch_invariance(claims.features, op):
            row(item, invariant, "claimed; see the .batch cases")
        elif invariant:
            row(item, True, f"{op} is batch-invariant on every case but does not claim it")
    return rows
