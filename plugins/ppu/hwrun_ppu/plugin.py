"""Hooks of the Alibaba T-HEAD Zhenwu PPU platform: its devices (through T-HEAD's SAIL torch,
see :func:`hwrun.devices.detect_ppu`) and nothing else yet; no op implementation is
registered, so every op runs on the reference when fallback is allowed. Not validated on PPU
hardware from this project."""

from __future__ import annotations

from hwrun.devices import detect_ppu
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun_ppu.serve_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)

NAME = "ppu"


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="alibaba",
        description="Alibaba T-HEAD Zhenwu PPU (M890, 810E): devices only, no op impls yet",
        version="0.1.0",
    ),
    detect_ppu,
)


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on PPU hardware from this project.",),
    )
