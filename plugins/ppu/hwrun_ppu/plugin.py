"""Hooks of the Alibaba T-HEAD Zhenwu PPU platform: its devices (through T-HEAD's SAIL torch,
see :func:`hwrun.devices.detect_ppu`) and nothing else yet; no op implementation is
registered, so every op runs on the reference when fallback is allowed. Not validated on PPU
hardware from this project."""

from __future__ import annotations

from hwrun.devices import detect_ppu
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, DeviceInfo, PlatformInfo

NAME = "ppu"


@hookimpl
def hwrun_api_version() -> str:
    return "1.1"


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="alibaba",
        description="Alibaba T-HEAD Zhenwu PPU (M890, 810E): devices only, no op impls yet",
        version="0.1.0",
    )


@hookimpl
def hwrun_devices() -> list[DeviceInfo]:
    return detect_ppu()


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on PPU hardware from this project.",),
    )
