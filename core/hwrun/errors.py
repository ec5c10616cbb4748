"""Exceptions meant for people: each says what was asked, why it cannot run, what to change."""


class HwrunError(Exception):
    """Base of every error hwrun raises on purpose. The CLI prints it and exits 1."""


class UsageError(HwrunError):
    """A value the user gave (an option, a file, an environment variable) that hwrun does not
    accept. The CLI prints it and exits 2, like a bad option."""


class ReasonsError(HwrunError):
    """A refusal with every reason at once: ``what`` could not be done, ``reasons`` say why."""

    def __init__(self, what: str, reasons: list[str]):
        self.reasons = list(reasons)
        super().__init__("\n".join([f"{what}:", *(f"  - {reason}" for reason in self.reasons)]))


class UnsupportedError(HwrunError):
    """A request that no implementation (or not the pinned one) can serve.

    ``reasons`` maps an implementation name to the reasons it gave.
    """

    def __init__(self, message: str, reasons: dict[str, list[str]] | None = None):
        self.reasons = dict(reasons or {})
        lines = [message]
        for impl, impl_reasons in self.reasons.items():
            joined = "; ".join(impl_reasons) if impl_reasons else "no reason given"
            lines.append(f"  - {impl}: {joined}")
        super().__init__("\n".join(lines))
