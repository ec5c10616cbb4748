"""Device detection helpers a plugin may call from its ``hwrun_devices`` hook.

Each helper lists one vendor's devices through its management library, every import guarded:
when there are none here, it raises :class:`NoDevices` with the reason (library not installed,
no driver, the library itself failing), which ``hwrun platforms`` shows. Core never calls them
on its own: a plugin's ``hwrun_devices`` decides, so a third-party vendor reports its devices
the same way (see :mod:`hwrun.target`, which turns the answer into a Target).
"""

from __future__ import annotations

import contextlib
import platform as host_platform
import shutil
from collections.abc import Callable

from hwrun.platform import DeviceInfo


class NoDevices(Exception):
    """No devices of this kind here; the message says why, for people."""


def detect_nvml() -> list[DeviceInfo]:
    """NVIDIA GPUs through nvidia-ml-py (``import pynvml``)."""
    try:
        import pynvml
    except Exception as exc:
        raise NoDevices(
            f"nvidia-ml-py is not importable ({_describe(exc)}); pip install 'hwrun-nvidia[nvml]'"
        ) from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver (NVMLError_LibraryNotFound and friends)
        raise NoDevices(f"NVML did not start ({_describe(exc)}): no NVIDIA driver here") from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                DeviceInfo(
                    index=index,
                    vendor="nvidia",
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    arch=f"sm_{major}{minor}",
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    driver=driver,
                    device_type="cuda",
                )
            )
    except Exception as exc:
        raise NoDevices(f"NVML failed while listing GPUs: {_describe(exc)}") from None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return _found(devices, "NVML lists no NVIDIA GPU")


def detect_amdsmi() -> list[DeviceInfo]:
    """AMD GPUs through amdsmi (its import raises KeyError, not ImportError, without ROCm)."""
    try:
        import amdsmi
    except Exception as exc:
        raise NoDevices(
            f"amdsmi is not importable ({_describe(exc)}): ROCm's libamd_smi is missing or "
            "amdsmi is not installed (pip install 'hwrun-amd[amdsmi]' on a ROCm machine)"
        ) from None
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:
        raise NoDevices(f"amdsmi did not start ({_describe(exc)}): no AMD GPU driver") from None
    try:
        devices = []
        for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
            vram = amdsmi.amdsmi_get_gpu_vram_info(handle)
            devices.append(
                DeviceInfo(
                    index=index,
                    vendor="amd",
                    name=str(asic.get("market_name", "AMD GPU")),
                    arch=str(asic.get("target_graphics_version", "")) or None,
                    memory_bytes=int(vram.get("vram_size", 0)) * 1024 * 1024 or None,
                    device_type="cuda",  # torch names ROCm devices 'cuda'
                )
            )
    except Exception as exc:
        raise NoDevices(f"amdsmi failed while listing GPUs: {_describe(exc)}") from None
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()
    return _found(devices, "amdsmi lists no AMD GPU")


def detect_tpu_info() -> list[DeviceInfo]:
    """TPU chips through tpu-info (``tpu_info.device.get_local_chips``). Their torch device type
    is torch_xla's ``"xla"``."""
    try:
        from tpu_info import device as tpu_device
    except Exception as exc:
        raise NoDevices(
            f"tpu-info is not importable ({_describe(exc)}); pip install 'hwrun-tpu[tpu-info]'"
        ) from None
    try:
        chip_type, count = tpu_device.get_local_chips()
    except Exception as exc:
        raise NoDevices(f"tpu-info failed while listing chips: {_describe(exc)}") from None
    if chip_type is None or not count:
        raise NoDevices("tpu-info lists no TPU chip")
    name = getattr(chip_type, "name", str(chip_type))
    return [
        DeviceInfo(index=i, vendor="tpu", name=f"TPU {name}", arch=name, device_type="xla")
        for i in range(count)
    ]


def detect_ppu() -> list[DeviceInfo]:
    """Zhenwu PPUs through T-HEAD's PyTorch build (SAIL): it marks itself with
    ``torch.version.sail`` and exposes the PPUs as ``torch.cuda`` devices. ``ppu-smi`` (the
    vendor's management tool) is only named in the reason when torch sees none. Not validated
    on PPU hardware from this project."""
    import torch

    sail = getattr(torch.version, "sail", None)
    if not sail:
        raise NoDevices(
            "this torch is not T-HEAD's SAIL build (torch.version.sail is not set); "
            "PPUs are reached only through it"
        )
    try:
        count = int(torch.cuda.device_count())
        devices = []
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                DeviceInfo(
                    index=index,
                    vendor="ppu",
                    name=str(props.name) or "Zhenwu PPU",
                    memory_bytes=int(props.total_memory) or None,
                    driver=str(sail),
                    device_type="cuda",
                )
            )
    except Exception as exc:
        raise NoDevices(f"SAIL torch {sail} failed while listing PPUs: {_describe(exc)}") from None
    tool = "ppu-smi is on PATH" if shutil.which("ppu-smi") else "ppu-smi is not on PATH either"
    return _found(
        devices, f"SAIL torch {sail} sees no PPU (torch.cuda.device_count() is 0; {tool})"
    )


def detect_cpu() -> list[DeviceInfo]:
    """The host CPU, the device of the reference platform."""
    name = host_platform.processor() or host_platform.machine() or "cpu"
    return [DeviceInfo(index=0, vendor="cpu", name=name, arch=host_platform.machine())]


def detect_none() -> list[DeviceInfo]:
    raise NoDevices("the plugin reports no devices")


# The detectors an API 1.0 plugin may name as its PlatformInfo.device_source.
DETECTORS: dict[str, Callable[[], list[DeviceInfo]]] = {
    "nvml": detect_nvml,
    "amdsmi": detect_amdsmi,
    "tpu-info": detect_tpu_info,
    "ppu": detect_ppu,
    "cpu": detect_cpu,
    "none": detect_none,
}


def detect(source: str) -> list[DeviceInfo]:
    """Devices of one ``device_source``; an unknown source is a plugin bug: ValueError."""
    try:
        detector = DETECTORS[source]
    except KeyError:
        known = ", ".join(sorted(DETECTORS))
        raise ValueError(
            f"unknown device_source {source!r}; known sources: {known} "
            "(or implement hwrun_devices and leave device_source out)"
        ) from None
    return detector()


def _found(devices: list[DeviceInfo], none_reason: str) -> list[DeviceInfo]:
    if not devices:
        raise NoDevices(none_reason)
    return devices


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
