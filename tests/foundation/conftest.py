"""Foundation tests describe a machine without accelerators, whatever machine runs them (CI
has none, the H200 has one): the vendor management libraries are hidden, so every vendor
plugin's real detector answers "no devices". A test that wants devices installs a fake
library (``fake_amdsmi``)."""

import sys
import types

import pytest

from hwrun.platform import DeviceInfo

LIBRARIES = ("pynvml", "amdsmi", "tpu_info", "tpu_info.device")


@pytest.fixture(autouse=True)
def _no_vendor_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in LIBRARIES:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError


def fake_amdsmi(monkeypatch: pytest.MonkeyPatch, gpus: list[DeviceInfo]) -> types.ModuleType:
    """An ``amdsmi`` module that lists ``gpus`` (name, arch, memory) as the real one would."""
    fake = types.ModuleType("amdsmi")
    fake.amdsmi_init = fake.amdsmi_shut_down = lambda: None
    fake.amdsmi_get_processor_handles = lambda: list(gpus)
    fake.amdsmi_get_gpu_asic_info = lambda gpu: {
        "market_name": gpu.name,
        "target_graphics_version": gpu.arch,
    }
    fake.amdsmi_get_gpu_vram_info = lambda gpu: {"vram_size": (gpu.memory_bytes or 0) >> 20}
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    return fake
