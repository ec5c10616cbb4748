"""Report tests describe a machine without accelerators, whatever machine runs them: the
vendor management libraries are hidden, so every vendor plugin finds no devices (as in
tests/foundation)."""

import sys
from pathlib import Path

import pytest

LIBRARIES = ("pynvml", "amdsmi", "tpu_info", "tpu_info.device")
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"


@pytest.fixture(autouse=True)
def _no_vendor_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in LIBRARIES:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
