"""Hooks of the Alibaba T-HEAD Zhenwu PPU platform (torch-native ops, W4A16 MoE). Not validated
on PPU hardware from this project."""

from __future__ import annotations

from hwrun import API_VERSION
from hwrun.deployment import Deployment, device_count_reasons
from hwrun.devices import detect_ppu
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpRegistry

NAME = "ppu"


@hookimpl
def hwrun_api_version() -> str:
    return API_VERSION


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="alibaba",
        description="Alibaba T-HEAD Zhenwu PPU (M890, 810E): torch-native ops, W4A16 MoE",
        device_source="ppu",
        version="0.1.0",
    )


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """No PPU op implementations are registered yet."""


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on PPU hardware from this project.",),
    )


@hookimpl
def hwrun_validate_deployment(deployment: Deployment) -> list[str]:
    return device_count_reasons(deployment, NAME, len(detect_ppu()), "Zhenwu PPU")
