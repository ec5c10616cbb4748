"""Hooks of the NVIDIA platform. Op implementations are registered per op family module."""

from __future__ import annotations

from hwrun import API_VERSION
from hwrun.deployment import Deployment, device_count_reasons
from hwrun.devices import detect_nvml
from hwrun.hookspecs import hookimpl
from hwrun.kernels.triton.registration import tier_claims
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpRegistry
from hwrun_nvidia import attn, indexer, kv, sparse_mla
from hwrun_nvidia.device_checks import triton_device_reasons

NAME = "nvidia"
TRITON_FAMILIES = ("indexer", "sparse_mla", "attn", "kv")  # registered by the modules below


@hookimpl
def hwrun_api_version() -> str:
    return API_VERSION


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="nvidia",
        description="NVIDIA GPUs (Hopper, Blackwell): Triton tier + DeepGEMM/FlashMLA adapters",
        device_source="nvml",
        version="0.1.0",
    )


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """The Triton tier (Hopper tuning) for every op family, vendor-library adapters above it.

    Each family module registers its own impls; kernels and vendor libraries are imported at
    the first call, so loading the plugin stays cheap and works without a GPU.
    """
    for family in (indexer, sparse_mla, attn, kv):
        family.register(registry)


@hookimpl
def hwrun_capabilities() -> Capabilities:
    """Claims computed from what the Triton tier's validate accepts on this host: the first
    NVIDIA GPU (as the conformance suite runs there), else CPU tensors, which only Triton's
    interpreter serves. Without either, nothing is claimed (the vendor adapters sit on the
    same ops, so they add no op of their own)."""
    devices = detect_nvml()
    device_type, arch = ("cuda", devices[0].arch) if devices else ("cpu", None)
    served = tier_claims(TRITON_FAMILIES, triton_device_reasons, device_type, arch)
    return Capabilities(
        ops=served.ops,
        formats=served.formats,
        features=served.features,
        dtypes=frozenset({"bfloat16", "float16", "float32", "float8_e4m3fn"}),
        notes=("FP4 tensor-core math needs Blackwell (sm_100+); Hopper reads FP4 as data.",),
    )


@hookimpl
def hwrun_validate_deployment(deployment: Deployment) -> list[str]:
    return device_count_reasons(deployment, NAME, len(detect_nvml()), "NVIDIA GPU")
