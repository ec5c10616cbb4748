import sys
import types

import pytest

from hwrun import devices


def test_no_accelerator_libraries_means_no_devices_and_no_traceback(monkeypatch):
    for module in ("pynvml", "amdsmi", "tpu_info", "tpu_info.device"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    assert devices.detect_nvml() == []
    assert devices.detect_amdsmi() == []
    assert devices.detect_tpu_info() == []
    assert devices.detect_ppu() == []


def test_nvml_without_a_driver_gives_no_devices(monkeypatch):
    fake = types.ModuleType("pynvml")

    def init():
        raise OSError("NVML Shared Library Not Found")

    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert devices.detect_nvml() == []


def test_nvml_devices_are_described(monkeypatch):
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlSystemGetDriverVersion = lambda: b"580.1"
    fake.nvmlDeviceGetCount = lambda: 2
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    fake.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=141 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    found = devices.detect_nvml()
    assert [(d.index, d.name, d.arch, d.driver) for d in found] == [
        (0, "NVIDIA H200", "sm_90", "580.1"),
        (1, "NVIDIA H200", "sm_90", "580.1"),
    ]


def test_cpu_is_the_reference_device():
    (cpu,) = devices.detect("cpu")
    assert cpu.vendor == "cpu"


def test_unknown_source_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known sources: amdsmi, cpu, none, nvml, ppu, tpu-info"):
        devices.detect("cuda")
