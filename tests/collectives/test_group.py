"""The distributed ops against the single-device references, in one gloo group per W.

Starting a process costs a torch import, so each W starts its group once (module-scoped
fixture) and runs every check there (group_checks.run_all); the tests below read the report.
"""

import pytest

from hwrun.collectives.launch import spawn_group

from .group_checks import run_all


@pytest.fixture(scope="module", params=[2, 3, 4, 8], ids=lambda w: f"W{w}")
def report(request: pytest.FixtureRequest) -> dict:
    ranks = spawn_group(run_all, request.param, timeout_s=60.0, deadline_s=240.0)
    return {"world": request.param, "ranks": ranks}


def _problems(report: dict, check: str) -> list[str]:
    return [f"rank {r}: {p}" for r, got in enumerate(report["ranks"]) for p in got[check]]


@pytest.mark.parametrize(
    "check",
    ["communicator", "topk_random", "topk_adversarial", "lse_combine", "tsp", "gather_context"],
)
def test_matches_single_device(report: dict, check: str) -> None:
    assert _problems(report, check) == []


def test_adversarial_inputs_take_the_resend_and_tie_rounds(report: dict) -> None:
    # the winners-on-one-rank rows need the resend round, the ReLU-zero rows the tie round
    assert all(r["resent_rows"] >= 4 for r in report["ranks"])
    assert all(r["tie_rows"] >= 4 for r in report["ranks"])
