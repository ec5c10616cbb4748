"""The conformance cases as pytest tests, for vendors' own pytest tooling.

    pytest --pyargs hwrun_conformance --hwrun-platform P
    pytest path/to/hwrun_conformance --hwrun-platform P      # the package's conftest loads this
    HWRUN_PLATFORM=P pytest --pyargs hwrun_conformance        # no options: the platform knob

Each (platform, case, impl) is one test run in the same worker process as `hwrun conformance`
(a crash or hang fails that test only). PASS passes, NOT_SUPPORTED skips with the reasons,
KNOWN_FAILURE is an xfail with its entry's reason, QUALITY_WARNING passes with a warning, FAIL,
CRASH and TIMEOUT fail. One more test per platform runs the capability audit over the results.

This module is the ``pytest11`` entry point of the hwrun distribution (pytest parses the
command line before it imports a ``--pyargs`` package, so the options must come from an entry
point). It is therefore loaded into every pytest run where hwrun is installed: it stays light,
importing no torch, and acts only on the conformance package's own tests. Without an install
(a tree on PYTHONPATH), ``-p hwrun_conformance.pytest_plugin`` loads it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from hwrun_conformance.status import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:  # the plugin module stays light: torch loads only when cases are planned
    from hwrun_conformance.runner import Job, Result

_RESULTS_KEY = pytest.StashKey[list]()


@dataclass(frozen=True)
class PlannedCase:
    """One test: a job to run, or a result already decided (NOT_SUPPORTED) when planning."""

    platform: str
    job: Job | None
    decided: Result | None

    @property
    def test_id(self) -> str:
        if self.job is not None:
            return f"{self.platform}:{self.job.case.case_id}[{self.job.impl.name}]"
        assert self.decided is not None
        return f"{self.platform}:{self.decided.op}/{self.decided.case}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hwrun", "hwrun conformance")
    group.addoption("--hwrun-platform", default=None, help="Platform name or 'all'.")
    group.addoption("--hwrun-ops", default="*", help="Glob over op names.")
    group.addoption("--hwrun-quick", action="store_true", help="Only the quick cases.")
    group.addoption(
        "--hwrun-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="Seconds per case."
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS_KEY] = []


def _option(config: pytest.Config, name: str, default: Any) -> Any:
    # With a default: when the package's conftest loads this plugin late (a --pyargs run
    # without -p), pytest parsed the command line before the option existed.
    return config.getoption(name, default)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_case" not in metafunc.fixturenames and "conformance_platform" not in (
        metafunc.fixturenames
    ):
        return
    from hwrun.plugins import load_plugins
    from hwrun_conformance.runner import RunOptions, plan

    config = metafunc.config
    plugins = load_plugins()
    requested = _option(config, "hwrun_platform", None)
    platforms = plugins.names() if requested == "all" else [plugins.choose_platform(requested)]
    if "conformance_platform" in metafunc.fixturenames:
        metafunc.parametrize("conformance_platform", platforms)
        return
    options = RunOptions(
        ops=_option(config, "hwrun_ops", "*"), quick=bool(_option(config, "hwrun_quick", False))
    )
    planned: list[PlannedCase] = []
    for platform in platforms:
        platform_plan = plan(plugins, platform, options)
        planned += [PlannedCase(platform, None, r) for r in platform_plan.decided]
        planned += [PlannedCase(platform, j, None) for j in platform_plan.jobs]
    metafunc.parametrize("conformance_case", planned, ids=[p.test_id for p in planned])


@pytest.fixture(scope="session")
def conformance_worker():
    from hwrun_conformance.worker import WorkerClient

    worker = WorkerClient()
    yield worker
    worker.close()


@pytest.fixture(scope="session")
def conformance_plugins():
    from hwrun.plugins import load_plugins

    return load_plugins()


def run_planned(request: pytest.FixtureRequest, case: PlannedCase, worker, plugins) -> None:
    """Run one planned case and turn its status into the pytest outcome."""
    from hwrun_conformance.known_failures import KNOWN_FAILURES
    from hwrun_conformance.runner import claims_batch_invariance, judge
    from hwrun_conformance.status import Status

    if case.decided is not None:
        result = case.decided
    else:
        job = case.job
        timeout = _option(request.config, "hwrun_timeout", DEFAULT_TIMEOUT_S)
        reply = worker.run(job.request(), timeout)
        claims = plugins.capabilities(job.platform)
        claimed = claims_batch_invariance(claims.features, job.case.op)
        result = judge(job, reply, claimed, KNOWN_FAILURES)
    request.config.stash[_RESULTS_KEY].append(result)
    message = f"{result.status}: {result.reason}" if result.reason else str(result.status)
    if result.status == Status.NOT_SUPPORTED:
        pytest.skip(message)
    if result.status == Status.KNOWN_FAILURE:
        pytest.xfail(message)
    if result.status == Status.QUALITY_WARNING:
        warnings.warn(message, stacklevel=1)
    if result.status in {Status.FAIL, Status.CRASH, Status.TIMEOUT}:
        pytest.fail(f"{message} (metric {result.metric}, value {result.value})", pytrace=False)


def audit_platform(request: pytest.FixtureRequest, platform: str, plugins) -> None:
    """The capability audit over the results this session collected for ``platform``."""
    from hwrun_conformance.audit import audit
    from hwrun_conformance.status import Status

    results = [r for r in request.config.stash[_RESULTS_KEY] if r.platform == platform]
    if not results:
        pytest.skip(f"no conformance case of {platform} ran in this session")
    ops = _option(request.config, "hwrun_ops", "*")
    rows = audit(plugins, platform, plugins.capabilities(platform), results, ops)
    failed = [f"{r.case}: {r.reason}" for r in rows if r.status == Status.FAIL]
    if failed:
        pytest.fail("claims not borne out:\n" + "\n".join(failed), pytrace=False)
