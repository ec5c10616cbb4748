"""The planner's refusal: every reason a configuration cannot be laid out, at once."""

from __future__ import annotations

from hwrun.errors import HwrunError


class PlanError(HwrunError):
    """A model / parallelism / format combination the planner cannot serve.

    ``reasons`` lists every problem found, so a person can fix them all in one go.
    """

    def __init__(self, what: str, reasons: list[str]):
        self.reasons = list(reasons)
        lines = [f"cannot plan {what}:"] + [f"  - {reason}" for reason in self.reasons]
        super().__init__("\n".join(lines))
