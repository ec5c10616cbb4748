import sys
import types

import pytest
import torch

from hwrun import devices
from hwrun.devices import NoDevices


@pytest.mark.parametrize(
    ("detector", "modules", "why"),
    [
        (devices.detect_nvml, ("pynvml",), "nvidia-ml-py is not importable"),
        (devices.detect_amdsmi, ("amdsmi",), "amdsmi is not importable"),
        (devices.detect_tpu_info, ("tpu_info", "tpu_info.device"), "tpu-info is not importable"),
    ],
)
def test_no_library_means_no_devices_with_the_reason(monkeypatch, detector, modules, why):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(NoDevices, match=why):
        detector()


def test_amdsmi_without_rocm_raises_keyerror_on_import_and_is_still_no_devices(monkeypatch):
    # What `import amdsmi` does with the wheel installed on a machine without ROCm.
    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name == "amdsmi":
                raise KeyError("libamd_smi.so")
            return None

    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    with pytest.raises(NoDevices, match=r"KeyError: 'libamd_smi.so'.*ROCm"):
        devices.detect_amdsmi()


def test_nvml_without_a_driver_gives_no_devices(monkeypatch):
    fake = types.ModuleType("pynvml")

    def init():
        raise OSError("NVML Shared Library Not Found")

    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(NoDevices, match=r"NVML did not start .*NVML Shared Library Not Found"):
        devices.detect_nvml()


def test_nvml_failing_midway_is_no_devices_not_a_crash(monkeypatch):
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlSystemGetDriverVersion = lambda: b"580.1"

    def count():
        raise RuntimeError("GPU is lost")

    fake.nvmlDeviceGetCount = count
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(NoDevices, match="GPU is lost"):
        devices.detect_nvml()


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
    assert [(d.index, d.name, d.arch, d.driver, d.device_type) for d in found] == [
        (0, "NVIDIA H200", "sm_90", "580.1", "cuda"),
        (1, "NVIDIA H200", "sm_90", "580.1", "cuda"),
    ]


def test_sail_torch_is_detected_as_ppus(monkeypatch):
    # T-HEAD's SAIL build marks itself in torch.version and exposes the PPUs as torch.cuda.
    monkeypatch.setattr(torch.version, "sail", "2.1.0", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    props = types.SimpleNamespace(name="PPU-M890", total_memory=96 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    found = devices.detect_ppu()
    assert [(d.vendor, d.name, d.device_type, d.driver) for d in found] == [
        ("ppu", "PPU-M890", "cuda", "2.1.0")
    ] * 2


def test_sail_torch_without_ppus_names_ppu_smi(monkeypatch):
    monkeypatch.setattr(torch.version, "sail", "2.1.0", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(NoDevices, match=r"sees no PPU .*ppu-smi"):
        devices.detect_ppu()


def test_ordinary_torch_is_not_a_ppu():
    assert getattr(torch.version, "sail", None) is None
    with pytest.raises(NoDevices, match=r"torch.version.sail is not set"):
        devices.detect_ppu()


def test_cpu_is_the_reference_device():
    (cpu,) = devices.detect("cpu")
    assert (cpu.vendor, cpu.device_type) == ("cpu", "cpu")


def test_unknown_source_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known sources: amdsmi, cpu, none, nvml, ppu, tpu-info"):
        devices.detect("cuda")
