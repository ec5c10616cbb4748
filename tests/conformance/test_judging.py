"""Status rules (advisory, batch claims, known failures) and the report files, on synthetic rows."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from hwrun.registry import OpImpl, OpSpec
from hwrun_conformance.case import BATCH, Case, Check, Sample
from hwrun_conformance.known_failures import KnownFailure, load_known_failures
from hwrun_conformance.report import summary_markdown, write_reports
from hwrun_conformance.runner import (
    Job,
    Result,
    claims_batch_invariance,
    conformant,
    judge,
)
from hwrun_conformance.status import Status
from hwrun_conformance.tolerances import Relaxation, Tolerance, tolerance_for
from hwrun_conformance.worker import Reply


def _job(name: str = "c", kind: str = "accuracy", must_pass: bool = True) -> Job:
    case = Case(
        op="attn.lse_combine",
        name=name,
        spec=OpSpec(op="attn.lse_combine"),
        build=lambda g: Sample({}, ()),
        checks={"out": Check("allclose")},
        kind=kind,
        must_pass=must_pass,
    )
    impl = OpImpl(op=case.op, name="k", platform="p", fn=lambda: None)
    return Job("p", case, impl, "cpu")


FAILED = Reply("verdict", {"passed": False, "metric": "out:allclose", "value": 3.0, "reason": "x"})
PASSED = Reply("verdict", {"passed": True, "metric": "out:allclose", "value": 0.1})


def test_advisory_failure_is_a_quality_warning_and_still_conformant() -> None:
    result = judge(_job(must_pass=False), FAILED, False, ())
    assert result.status == Status.QUALITY_WARNING
    assert conformant([result], "p")


def test_batch_variance_fails_only_when_claimed() -> None:
    varies = Reply(
        "verdict", {"passed": False, "metric": "batch_invariance", "value": 3.0, "reason": "x"}
    )
    assert judge(_job(kind=BATCH), varies, True, ()).status == Status.FAIL
    unclaimed = judge(_job(kind=BATCH), varies, False, ())
    assert unclaimed.status == Status.NOT_SUPPORTED and "not claimed" in unclaimed.reason
    # Rows run alone that are wrong against the reference (or raise) fail, claimed or not.
    assert judge(_job(kind=BATCH), FAILED, False, ()).status == Status.FAIL
    assert claims_batch_invariance(frozenset({"batch_invariant"}), "moe.route")
    assert claims_batch_invariance(frozenset({"batch_invariant:indexer.*"}), "indexer.topk")
    assert not claims_batch_invariance(frozenset({"batch_invariant:indexer.*"}), "moe.route")


def test_known_failures_apply_to_broken_cases_only() -> None:
    entry = KnownFailure("p", "attn.*", "c*", "tracked in #1")
    crashed = judge(_job(), Reply("crash", reason="worker killed by SIGSEGV"), False, (entry,))
    assert crashed.status == Status.KNOWN_FAILURE and "#1" in crashed.reason
    assert "SIGSEGV" in crashed.reason
    assert not conformant([crashed], "p") and conformant([crashed], "p", accept_known_failures=True)
    passed = judge(_job(), PASSED, False, (entry,))
    assert passed.status == Status.PASS and "known-failure entry" in passed.reason
    assert judge(_job("other"), FAILED, False, (entry,)).status == Status.FAIL


def test_known_failures_file_needs_every_field(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[known_failure]]\nplatform="p"\nop="*"\ncase="*"\nreason="why"\n')
    assert load_known_failures(good) == (KnownFailure("p", "*", "*", "why"),)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[known_failure]]\nplatform="p"\nop="*"\ncase="*"\n')
    with pytest.raises(ValueError, match="reason"):
        load_known_failures(bad)


def test_relaxations_win_and_carry_their_reason() -> None:
    relax = Relaxation("amd", "attn.*", "out", "bfloat16", Tolerance(1.0, 0.1, 0.1), "FNUZ")
    assert tolerance_for("amd", "attn.lse_combine", "out", "bfloat16", (relax,))[1] == "FNUZ"
    assert tolerance_for("nvidia", "attn.lse_combine", "out", "bfloat16", (relax,))[1] is None


def test_reports_hold_every_row(tmp_path: Path) -> None:
    rows = [
        Result("p", "attn.lse_combine", "a", Status.PASS, impl="k", value=0.5, threshold=1.0),
        Result("p", "attn.lse_combine", "b", Status.FAIL, impl="k", value=float("inf")),
        Result("q", "attn.lse_combine", "a", Status.NOT_SUPPORTED, reason="q: no | kernel"),
    ]
    write_reports(rows, tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [x["status"] for x in lines] == ["PASS", "FAIL", "NOT_SUPPORTED"]
    assert lines[1]["value"] == "inf"
    suites = ET.parse(tmp_path / "junit.xml").getroot().findall("testsuite")
    assert [(s.get("name"), s.get("failures"), s.get("skipped")) for s in suites] == [
        ("hwrun-conformance.p", "1", "0"),
        ("hwrun-conformance.q", "0", "1"),
    ]
    summary = summary_markdown(rows)
    assert "| `attn.lse_combine` | FAIL 1 · PASS 1 | NOT_SUPPORTED 1 |" in summary
    assert "**not conformant** | nothing run here |" in summary
    assert "- p: not conformant (2 run, 1 passed, 0 not supported)" in summary
    assert "- q: nothing run here (0 run, 0 passed, 1 not supported): no impl of" in summary


def test_quality_target_between_pass_and_fail() -> None:
    import torch

    from hwrun_conformance.execute import run_case

    case = Case(
        op="kda.step",  # tolerance row: float32 atol = rtol = 1e-4, quality target 0.5
        name="q",
        spec=OpSpec(op="kda.step", dtype="float32"),
        build=lambda g: Sample({"x": torch.zeros(4)}, ("o",)),
        checks={"o": Check("allclose")},
    )
    job = Job("p", case, OpImpl(op=case.op, name="k", platform="p", fn=lambda: None), "cpu")

    def status(offset: float) -> Status:
        verdict = run_case(case, lambda x: x + offset, lambda x: x.clone(), platform="p")
        return judge(job, Reply("verdict", verdict.__dict__), False, ()).status

    assert status(0.0) == Status.PASS
    assert status(0.7e-4) == Status.QUALITY_WARNING
    assert status(2e-4) == Status.FAIL


def test_format_audit_judges_only_formats_of_the_selected_ops() -> None:
    from hwrun.platform import Capabilities
    from hwrun.plugins import load_plugins
    from hwrun_conformance.audit import audit

    plugins = load_plugins([])
    claims = Capabilities(ops=frozenset({"sparse_mla.decode"}), formats=frozenset({"fp8", "bf16"}))
    ran = Result("reference", "sparse_mla.decode", "bf16_h16", Status.PASS, impl="reference")
    ran = replace(ran, formats=("bf16",))
    # --ops 'sparse_mla.*': no selected case uses the index-key format fp8, so it is not judged.
    rows = audit(plugins, "reference", claims, [ran], "sparse_mla.*")
    assert {r.case: r.status for r in rows if r.case.startswith("formats:")} == {
        "formats:bf16": Status.PASS
    }
    # A selected case in fp8 that no impl ran: the claim is not borne out.
    refused = Result("reference", "kv.write_index_keys", "fp8_small", Status.NOT_SUPPORTED)
    refused = replace(refused, formats=("fp8",), refusals=(("fast", "needs a GPU"),))
    rows = audit(plugins, "reference", claims, [ran, refused], "*")
    fp8 = next(r for r in rows if r.case == "formats:fp8")
    assert fp8.status == Status.FAIL and "no implemented op runs a case in it" in fp8.reason
    # The same case of an op the platform does not implement says nothing about the claim.
    rows = audit(plugins, "reference", claims, [ran, replace(refused, refusals=())], "*")
    assert "formats:fp8" not in {r.case for r in rows}
    # Under an --ops filter an op outside it may run fp8 (a claim names no op): not judged...
    rows = audit(plugins, "reference", claims, [ran, refused], "kv.*")
    assert "formats:fp8" not in {r.case for r in rows}
    # ...but a case that ran in fp8 and failed still fails the claim.
    failed = replace(refused, status=Status.FAIL, impl="fast", refusals=())
    rows = audit(plugins, "reference", claims, [ran, failed], "kv.*")
    assert next(r for r in rows if r.case == "formats:fp8").status == Status.FAIL


def test_topk_invariance_tiers_compare_rows_as_sets() -> None:
    """A GPU top-k gathers with several programs and writes a row's indices in the order they
    finish: the padding and batch tiers must accept any order, and still catch another set."""
    import itertools

    import torch

    from hwrun.ops.catalogue import catalogue
    from hwrun.ops.topk import topk
    from hwrun_conformance.cases import all_cases
    from hwrun_conformance.execute import run_case

    calls = itertools.count()

    def shuffled(logits, starts, ends, k):
        out = topk(logits, starts, ends, k)
        order = torch.randperm(k, generator=torch.Generator().manual_seed(next(calls)))
        return out[:, order]

    def wrong_on_second_call(logits, starts, ends, k):
        out = topk(logits, starts, ends, k)
        return torch.where(out > 0, out - 1, out) if next(calls) % 2 else out

    cases = {c.name: c for c in all_cases(catalogue())["indexer.topk"]}
    reference = catalogue()["indexer.topk"].reference
    for name in ("long_rows.padding", "long_rows.batch", "random.padding", "random.batch"):
        assert run_case(cases[name], shuffled, reference, platform="p").passed, name
    verdict = run_case(cases["long_rows.padding"], wrong_on_second_call, reference, platform="p")
    assert not verdict.passed and verdict.metric == "padding_invariance", verdict
