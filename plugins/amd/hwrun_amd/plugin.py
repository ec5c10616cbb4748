"""Hooks of the AMD Instinct platform. Op implementations are registered per op family module.

The portable Triton tier (kernels in core, shared with the NVIDIA plugin) is the whole of it:
no AITER or FlyDSL adapter is registered, because none has been validated on hardware from this
project.
"""

from __future__ import annotations

from hwrun import API_VERSION
from hwrun.deployment import Deployment, device_count_reasons
from hwrun.devices import detect_amdsmi
from hwrun.hookspecs import hookimpl
from hwrun.kernels.triton.registration import tier_claims
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpRegistry
from hwrun_amd import attn, indexer, kv, sparse_mla
from hwrun_amd.device_checks import triton_device_reasons

NAME = "amd"
TRITON_FAMILIES = ("indexer", "sparse_mla", "attn", "kv")  # registered by the modules below


@hookimpl
def hwrun_api_version() -> str:
    return API_VERSION


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME,
        vendor="amd",
        description="AMD Instinct GPUs (CDNA3/CDNA4): portable Triton tier",
        device_source="amdsmi",
        version="0.1.0",
    )


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """The Triton tier for every op family; kernels are imported at the first call, so loading
    the plugin stays cheap and works without a GPU."""
    for family in (indexer, sparse_mla, attn, kv):
        family.register(registry)


@hookimpl
def hwrun_capabilities() -> Capabilities:
    """Claims computed from what the Triton tier's validate accepts on this host: the first AMD
    GPU (its architecture decides fp8), else CPU tensors, which only Triton's interpreter
    serves. Without either, nothing is claimed."""
    devices = detect_amdsmi()
    device_type, arch = ("cuda", devices[0].arch) if devices else ("cpu", None)
    served = tier_claims(TRITON_FAMILIES, triton_device_reasons, device_type, arch)
    return Capabilities(
        ops=served.ops,
        formats=served.formats,
        features=served.features,
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        notes=(
            "gfx942 (MI300) computes FP8 in the FNUZ variant (float8_e4m3fnuz): the Triton "
            "kernels that read OCP e4m3fn codes (indexer logits, fp8_ds_mla decode) refuse it; "
            "gfx950 (MI355X) uses OCP e4m3fn and has native MXFP4.",
            "The Triton kernels pad heads in registers (any head count runs); AITER's sparse "
            "MLA kernels would need heads padded to a multiple of 16.",
            "The Triton kernels run with their H200-tuned defaults; not validated on AMD "
            "hardware from this project.",
        ),
    )


@hookimpl
def hwrun_validate_deployment(deployment: Deployment) -> list[str]:
    return device_count_reasons(deployment, NAME, len(detect_amdsmi()), "AMD GPU")
