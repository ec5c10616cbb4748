"""Device discovery through each vendor's management library, every import guarded.

A machine without a library, a driver or a device gets an empty list and no traceback. Each
detector is named by the ``device_source`` of a :class:`hwrun.platform.PlatformInfo`.
"""

from __future__ import annotations

import contextlib
import platform as host_platform
from collections.abc import Callable

from hwrun.platform import DeviceInfo


def detect_nvml() -> list[DeviceInfo]:
    """NVIDIA GPUs through nvidia-ml-py (``import pynvml``)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver (NVMLError_LibraryNotFound and friends)
        return []
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
                )
            )
        return devices
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def detect_amdsmi() -> list[DeviceInfo]:
    """AMD GPUs through amdsmi."""
    try:
        import amdsmi
    except ImportError:
        return []
    try:
        amdsmi.amdsmi_init()
    except Exception:
        return []
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
                )
            )
        return devices
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def detect_tpu_info() -> list[DeviceInfo]:
    """TPU chips through tpu-info (``tpu_info.device.get_local_chips``)."""
    try:
        from tpu_info import device as tpu_device
    except ImportError:
        return []
    try:
        chip_type, count = tpu_device.get_local_chips()
    except Exception:
        return []
    if chip_type is None or not count:
        return []
    name = getattr(chip_type, "name", str(chip_type))
    return [DeviceInfo(index=i, vendor="tpu", name=f"TPU {name}", arch=name) for i in range(count)]


def detect_ppu() -> list[DeviceInfo]:
    """Zhenwu PPUs. The vendor exposes them through its PyTorch device extension, which is not
    public; hwrun looks for ``torch.ppu`` and reports nothing without it (not validated on
    hardware)."""
    import torch

    ppu = getattr(torch, "ppu", None)
    if ppu is None:
        return []
    try:
        count = int(ppu.device_count())
    except Exception:
        return []
    return [DeviceInfo(index=i, vendor="ppu", name="Zhenwu PPU") for i in range(count)]


def detect_cpu() -> list[DeviceInfo]:
    """The host CPU, the device of the reference platform."""
    name = host_platform.processor() or host_platform.machine() or "cpu"
    return [DeviceInfo(index=0, vendor="cpu", name=name, arch=host_platform.machine(), driver=None)]


def detect_none() -> list[DeviceInfo]:
    return []


DETECTORS: dict[str, Callable[[], list[DeviceInfo]]] = {
    "nvml": detect_nvml,
    "amdsmi": detect_amdsmi,
    "tpu-info": detect_tpu_info,
    "ppu": detect_ppu,
    "cpu": detect_cpu,
    "none": detect_none,
}


def detect(source: str) -> list[DeviceInfo]:
    """Devices of one source; an unknown source is a plugin bug and raises ValueError."""
    try:
        detector = DETECTORS[source]
    except KeyError:
        known = ", ".join(sorted(DETECTORS))
        raise ValueError(f"unknown device_source {source!r}; known sources: {known}") from None
    return detector()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
