"""What the worker keeps loaded between cases: plugins, registries, references and cases."""

from __future__ import annotations

from hwrun.ops.catalogue import catalogue
from hwrun.plugins import load_plugins
from hwrun_conformance.cases import all_cases, find_case
from hwrun_conformance.execute import Verdict, run_case


class CaseSession:
    def __init__(self) -> None:
        self.plugins = load_plugins()
        self.contracts = catalogue()
        self.cases = {
            case.case_id: case for cases in all_cases(self.contracts).values() for case in cases
        }

    def run(self, platform: str, impl: str, op: str, case: str, device: str = "cpu") -> Verdict:
        impls = {i.name: i for i in self.plugins.registry(platform).impls(op)}
        known = self.cases.get(f"{op}/{case}")
        return run_case(
            known if known is not None else find_case(op, case),  # a fuzz case: from its name
            impls[impl].fn,
            self.contracts[op].reference,
            platform=platform,
            device=device,
        )
