"""The conformance suite as pytest tests (see :mod:`hwrun_conformance.pytest_plugin`)."""

from __future__ import annotations

from hwrun_conformance.pytest_plugin import audit_platform, run_planned


def test_case(request, conformance_case, conformance_worker, conformance_plugins) -> None:
    run_planned(request, conformance_case, conformance_worker, conformance_plugins)


def test_capabilities(request, conformance_platform, conformance_plugins) -> None:
    audit_platform(request, conformance_platform, conformance_plugins)
