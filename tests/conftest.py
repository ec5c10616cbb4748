"""Shared test setup: tests must not see plugins from the user's environment by accident."""

import pytest


@pytest.fixture(autouse=True)
def _clean_hwrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for knob in (
        "HWRUN_PLUGINS",
        "HWRUN_PLATFORM",
        "HWRUN_REFERENCE_FALLBACK",
        "HWRUN_DISABLE_ENTRY_POINTS",
    ):
        monkeypatch.delenv(knob, raising=False)
