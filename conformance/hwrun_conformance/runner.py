"""The conformance run: plan the cases of each platform, run them in a worker, judge, audit.

Only a platform's own implementations are tested, never the reference fallback: an op the
platform does not implement, or a case every one of its impls refuses in ``validate``, is
NOT_SUPPORTED with the reasons. Every impl that accepts a case runs it, so a platform with a
Triton and a vendor-library impl of the same op gets both checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase

from hwrun.ops.catalogue import catalogue
from hwrun.platform import Capabilities
from hwrun.plugins import PluginSet
from hwrun.registry import OpImpl
from hwrun.target import Target
from hwrun_conformance.audit import audit
from hwrun_conformance.case import BATCH, BATCH_METRIC, Case
from hwrun_conformance.cases import all_cases, fuzz_cases, uncovered
from hwrun_conformance.known_failures import KNOWN_FAILURES, KnownFailure, find_known_failure
from hwrun_conformance.result import UNCOVERED, Result, claims_batch_invariance
from hwrun_conformance.status import BROKEN, CONFORMANT, DEFAULT_TIMEOUT_S, Status
from hwrun_conformance.verdict import PLUGIN_OP
from hwrun_conformance.worker import Reply, WorkerClient


@dataclass(frozen=True)
class Job:
    platform: str
    case: Case
    impl: OpImpl
    device: str

    def request(self) -> dict[str, str]:
        """What the worker needs to rebuild and run this job (names only)."""
        return {
            "platform": self.platform,
            "impl": self.impl.name,
            "op": self.case.op,
            "case": self.case.name,
            "device": self.device,
        }


@dataclass
class RunOptions:
    ops: str = "*"  # glob over op names
    quick: bool = False
    timeout: float = DEFAULT_TIMEOUT_S
    known_failures: tuple[KnownFailure, ...] = KNOWN_FAILURES
    accept_known_failures: bool = False
    device: str | None = None  # None: the platform's devices when present, else cpu
    fuzz: int = 0  # > 0: this many random specs per op instead of the named cases
    seed: int = 0  # the fuzz seed


@dataclass
class Plan:
    jobs: list[Job] = field(default_factory=list)
    decided: list[Result] = field(default_factory=list)  # NOT_SUPPORTED without running anything
    target: Target | None = None  # where the platform's impls run


def plan(plugins: PluginSet, platform: str, options: RunOptions) -> Plan:
    contracts = catalogue()
    registry = plugins.registry(platform)
    target = run_target(plugins, platform, options)
    result = Plan(target=target)
    for op in uncovered(contracts):
        if fnmatchcase(op, options.ops):
            reason = "the suite has no cases for this op yet (a gap in hwrun, not the platform)"
            result.decided.append(
                Result(
                    platform,
                    op,
                    "-",
                    Status.NOT_SUPPORTED,
                    reason=reason,
                    must_pass=False,
                    kind=UNCOVERED,
                )
            )
    selected = (
        fuzz_cases(contracts, options.seed, options.fuzz) if options.fuzz else all_cases(contracts)
    )
    for op, cases in selected.items():
        if not fnmatchcase(op, options.ops):
            continue
        impls = registry.impls(op)
        for case in cases:
            if options.quick and not case.quick:
                continue
            spec = target.place(case.spec)
            refusals: dict[str, list[str]] = {}
            for impl in impls:
                reasons = _reasons(impl, spec)
                if reasons:
                    refusals[impl.name] = reasons
                else:
                    result.jobs.append(Job(platform, case, impl, target.device_type))
            if len(refusals) == len(impls):
                result.decided.append(_not_supported(platform, case, refusals))
    return result


def run_target(plugins: PluginSet, platform: str, options: RunOptions) -> Target:
    """Where a platform's cases run: its Target (its devices when torch reaches them, else the
    CPU), or the device type ``--device`` forces."""
    target = plugins.target(platform)
    return target.on(options.device) if options.device else target


def run(
    plugins: PluginSet,
    platforms: list[str],
    options: RunOptions,
    on_result: Callable[[Result], None] | None = None,
    on_planned: Callable[[int], None] | None = None,
    on_plans: Callable[[dict[str, Plan]], None] | None = None,
) -> list[Result]:
    """Every case of every platform; ``on_planned`` gets the job count, ``on_plans`` the plans
    (the target of each platform), ``on_result`` each row. A platform whose hooks raise or
    return the wrong type while it is planned or audited gets one FAIL row saying so (op
    ``plugin``: its verdict is "broken") and the others still run."""
    worker = WorkerClient()
    worker.start()  # loads torch while the plans are made
    plans: dict[str, Plan] = {}
    faults: dict[str, Result] = {}
    for platform in platforms:
        try:
            plans[platform] = plan(plugins, platform, options)
        except Exception as exc:  # a plugin's hook or validator broke while planning
            faults[platform] = plugin_fault(platform, "its cases were planned", exc)
    if on_planned:
        on_planned(sum(len(p.jobs) + len(p.decided) for p in plans.values()) + len(faults))
    if on_plans:
        on_plans(plans)
    results: list[Result] = []

    def emit(result: Result) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    try:
        for platform in platforms:
            if platform in faults:
                emit(faults[platform])
                continue
            try:
                claims = capabilities(plugins, platform, options)
            except Exception as exc:
                emit(plugin_fault(platform, "hwrun_capabilities was called", exc))
                continue
            start = len(results)
            for result in plans[platform].decided:
                emit(result)
            for job in plans[platform].jobs:
                reply = worker.run(job.request(), options.timeout)
                claimed = claims_batch_invariance(claims.features, job.case.op)
                emit(judge(job, reply, claimed, options.known_failures))
            platform_results = results[start:]
            for row in audit(plugins, platform, claims, platform_results, options.ops):
                emit(row)
    except BaseException:
        worker.close(kill=True)  # interrupted: the case in flight is abandoned, not awaited
        raise
    worker.close()
    return results


def capabilities(plugins: PluginSet, platform: str, options: RunOptions) -> Capabilities:
    """The platform's claims on its target; a hook returning anything else raises TypeError."""
    claims = plugins.capabilities(platform, run_target(plugins, platform, options))
    if not isinstance(claims, Capabilities):
        raise TypeError(
            f"hwrun_capabilities returned {type(claims).__name__}, expected "
            "hwrun.platform.Capabilities"
        )
    return claims


def plugin_fault(platform: str, stage: str, exc: BaseException) -> Result:
    """The one row of a platform whose plugin broke during the run: FAIL, op ``plugin``."""
    return Result(
        platform=platform,
        op=PLUGIN_OP,
        case="hooks",
        status=Status.FAIL,
        reason=f"the plugin raised while {stage}: {type(exc).__name__}: {exc}",
        kind=PLUGIN_OP,
    )


def unusable_plugins(plugins: PluginSet) -> list[Result]:
    """One FAIL row per plugin that did not load (broken or incompatible), with its reason, so
    a run over every platform shows it instead of leaving it out."""
    return [
        Result(
            platform=p.name,
            op=PLUGIN_OP,
            case="load",
            status=Status.FAIL,
            reason=f"{p.status}: {p.reason} ({p.origin}: {p.module})",
            kind=PLUGIN_OP,
        )
        for p in plugins.plugins
        if p.status != "loaded"
    ]


def conformant(results: list[Result], platform: str, accept_known_failures: bool = False) -> bool:
    allowed = CONFORMANT | ({Status.KNOWN_FAILURE} if accept_known_failures else set())
    return all(r.status in allowed for r in results if r.platform == platform and r.must_pass)


def judge(job: Job, reply: Reply, batch_claimed: bool, known: tuple[KnownFailure, ...]) -> Result:
    """The final status of one job from the worker's reply: CRASH/TIMEOUT as they came, the
    verdict's PASS/FAIL, a BATCH case whose rows alone are right but differ from the full
    batch's bits, not claimed -> NOT_SUPPORTED (rows alone that are wrong stay FAIL), a failed
    advisory case or a pass above the quality target -> QUALITY_WARNING, a broken case with a
    known-failure entry -> KNOWN_FAILURE."""
    case = job.case
    base = Result(
        platform=job.platform,
        op=case.op,
        case=case.name,
        status=Status.FAIL,
        impl=job.impl.name,
        seed=case.seed,
        must_pass=case.must_pass,
        kind=case.kind,
        seconds=round(reply.seconds, 3),
        about=case.about,
        formats=case.spec.formats,
    )
    if reply.kind == "crash":
        result = replace(base, status=Status.CRASH, reason=reply.reason)
    elif reply.kind == "timeout":
        result = replace(base, status=Status.TIMEOUT, reason=reply.reason)
    else:
        verdict = reply.verdict or {}
        result = replace(
            base,
            metric=verdict.get("metric"),
            value=verdict.get("value"),
            threshold=verdict.get("threshold"),
            reason=verdict.get("reason", ""),
            relaxation=verdict.get("relaxation"),
            status=Status.PASS if verdict.get("passed") else Status.FAIL,
        )
        varies = result.metric == BATCH_METRIC  # right answers that differ with the batch
        if result.status == Status.FAIL and case.kind == BATCH and varies and not batch_claimed:
            result = replace(
                result,
                status=Status.NOT_SUPPORTED,
                reason=f"not batch-invariant (not claimed): {result.reason}",
            )
        elif (result.status == Status.FAIL and not case.must_pass) or (
            result.status == Status.PASS and verdict.get("below_quality")
        ):
            result = replace(result, status=Status.QUALITY_WARNING)
    entry = find_known_failure(known, job.platform, case.op, case.name)
    if entry is not None and result.status in BROKEN:
        result = replace(
            result, status=Status.KNOWN_FAILURE, reason=f"{entry.reason} [{result.reason}]"
        )
    elif entry is not None and result.status == Status.PASS:
        result = replace(
            result, reason=f"passes although a known-failure entry matches it ({entry.reason})"
        )
    return result


def _not_supported(platform: str, case: Case, refusals: dict[str, list[str]]) -> Result:
    if refusals:
        reason = "; ".join(f"{impl}: {', '.join(r)}" for impl, r in refusals.items())
    else:
        reason = f"{platform} does not implement {case.op} (the reference fallback is not tested)"
    return Result(
        platform=platform,
        op=case.op,
        case=case.name,
        status=Status.NOT_SUPPORTED,
        seed=case.seed,
        reason=reason,
        must_pass=case.must_pass,
        kind=case.kind,
        about=case.about,
        formats=case.spec.formats,
        refusals=tuple((impl, reason) for impl, reasons in refusals.items() for reason in reasons),
    )


def _reasons(impl: OpImpl, spec) -> list[str]:
    try:
        return list(impl.validate(spec))
    except Exception as exc:  # a broken validator refuses rather than taking the run down
        return [f"validate() raised {type(exc).__name__}: {exc}"]
