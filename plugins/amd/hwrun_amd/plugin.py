"""Hooks of the AMD Instinct platform. Vendor libraries (AITER, FlyDSL) are not validated on
hardware from this project; the portable tier is Triton."""

from __future__ import annotations

from hwrun import API_VERSION
from hwrun.deployment import Deployment, device_count_reasons
from hwrun.devices import detect_amdsmi
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpRegistry

NAME = "amd"


@hookimpl
def hwrun_api_version() -> str:
    return API_VERSION


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="amd",
        description="AMD Instinct GPUs (CDNA3/CDNA4): Triton tier + AITER/FlyDSL adapters",
        device_source="amdsmi",
        version="0.1.0",
    )


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """No AMD op implementations are registered yet."""


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        notes=(
            "gfx942 (MI300) computes FP8 in the FNUZ variant (float8_e4m3fnuz); "
            "gfx950 (MI355X) uses OCP e4m3fn and has native MXFP4.",
            "Sparse MLA kernels there pad heads to a multiple of 16.",
        ),
    )


@hookimpl
def hwrun_validate_deployment(deployment: Deployment) -> list[str]:
    return device_count_reasons(deployment, NAME, len(detect_amdsmi()), "AMD GPU")
