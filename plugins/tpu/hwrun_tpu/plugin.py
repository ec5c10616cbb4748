"""Hooks of the Google TPU platform: its devices (through tpu-info) and nothing else yet; no op
implementation is registered, so every op runs on the reference when fallback is allowed."""

from __future__ import annotations

from hwrun.devices import detect_tpu_info
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, DeviceInfo, PlatformInfo

NAME = "tpu"


@hookimpl
def hwrun_api_version() -> str:
    return "1.1"


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="google",
        description="Google TPUs: devices only, no op implementations yet",
        version="0.1.0",
    )


@hookimpl
def hwrun_devices() -> list[DeviceInfo]:
    return detect_tpu_info()


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on TPU hardware from this project.",),
    )
