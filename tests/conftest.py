"""Shared test setup: tests must not see plugins from the user's environment by accident."""

import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated, and any test (a conformance run
# loading the NVIDIA plugin, say) may import the kernels first: set it before anything else on a
# machine without a GPU, so the kernels run in Triton's CPU interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _clean_hwrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for knob in (
        "HWRUN_PLUGINS",
        "HWRUN_PLATFORM",
        "HWRUN_REFERENCE_FALLBACK",
        "HWRUN_DISABLE_ENTRY_POINTS",
    ):
        monkeypatch.delenv(knob, raising=False)
