"""Hooks of the Google TPU platform: its devices (through tpu-info) and nothing else yet; no op
implementation is registered, so every op runs on the reference when fallback is allowed."""

from __future__ import annotations

from hwrun.devices import detect_tpu_info
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun_tpu.serve_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)

NAME = "tpu"


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="google",
        description="Google TPUs: devices only, no op implementations yet",
        version="0.1.0",
    ),
    detect_tpu_info,
)


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on TPU hardware from this project.",),
    )
