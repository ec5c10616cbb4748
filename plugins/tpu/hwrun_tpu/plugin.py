"""Hooks of the Google TPU platform (Pallas kernels through JAX; interpret mode on CPU)."""

from __future__ import annotations

from hwrun import API_VERSION
from hwrun.deployment import Deployment, device_count_reasons
from hwrun.devices import detect_tpu_info
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpRegistry

NAME = "tpu"


@hookimpl
def hwrun_api_version() -> str:
    return API_VERSION


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="google",
        description="Google TPUs: Pallas kernels through JAX (torch <-> jax via DLPack)",
        device_source="tpu-info",
        version="0.1.0",
    )


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """No TPU op implementations are registered yet."""


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on TPU hardware from this project.",),
    )


@hookimpl
def hwrun_validate_deployment(deployment: Deployment) -> list[str]:
    return device_count_reasons(deployment, NAME, len(detect_tpu_info()), "TPU chip")
