"""Foundation tests describe a machine without accelerators, whatever machine runs them (CI
has none, the H200 has one): each vendor plugin's device detection is hidden. A test that
wants devices patches its own in after this."""

import pytest

from hwrun.devices import NoDevices

DETECTORS = (
    "hwrun_nvidia.plugin.detect_nvml",
    "hwrun_amd.plugin.detect_amdsmi",
    "hwrun_tpu.plugin.detect_tpu_info",
    "hwrun_ppu.plugin.detect_ppu",
)


def _hidden() -> list:
    raise NoDevices("hidden by the foundation tests")


@pytest.fixture(autouse=True)
def _no_vendor_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    for detector in DETECTORS:
        monkeypatch.setattr(detector, _hidden)
