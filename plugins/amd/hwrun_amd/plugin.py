"""Hooks of the AMD Instinct platform: the portable Triton tier (kernels in core, shared with
the NVIDIA and PPU plugins) under AITER adapters (:mod:`hwrun_amd.aiter_indexer`,
:mod:`~hwrun_amd.aiter_mla`, :mod:`~hwrun_amd.aiter_moe`).

Priorities: an AITER adapter (when AMD's AITER imports and the spec suits it) 20, Triton 10.
The AITER adapters are registered only when ``aiter`` imports and is AMD's (PyPI ``amd-aiter``,
:mod:`hwrun_amd.aiter_library`); none is validated on hardware from this project: their
conventions are tested against a fake AITER (plugins/amd/tests/fake_aiter.py).

Triton: any number of heads runs (the kernels pad heads in registers: the indexer to a power
of two of at least 16, the sparse MLA decode to blocks of 128). Kernels that read OCP e4m3fn
codes (indexer logits, fp8_ds_mla decode) are refused on gfx942 (FNUZ fp8, see
:mod:`hwrun_amd.device_checks`); the cache writes compute e4m3 and e2m1 bits with integer
arithmetic, so the rows they write are exact on gfx942 too.
"""

from __future__ import annotations

from hwrun.devices import detect_amdsmi
from hwrun.hookspecs import hookimpl
from hwrun.kernels.triton.registration import TritonTier
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun.registry import OpRegistry
from hwrun.target import Target
from hwrun_amd import aiter_indexer, aiter_mla, aiter_moe
from hwrun_amd.aiter_library import aiter_problem, register_adapters
from hwrun_amd.device_checks import TUNED_FOR, triton_device_reasons
from hwrun_amd.serve_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)

NAME = "amd"
TRITON = TritonTier(triton_device_reasons, TUNED_FOR)
AITER_PRIORITY = 20


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="amd",
        description="AMD Instinct GPUs (CDNA3/CDNA4): portable Triton tier + AITER adapters",
        version="0.2.0",
    ),
    detect_amdsmi,
)


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """The Triton tier, the AITER adapters above it when AMD's AITER imports. Triton kernels are
    imported at the first call; AITER is imported here, only where it is installed."""
    TRITON.register(registry)
    if aiter_problem() is None:
        for family in (aiter_indexer, aiter_mla, aiter_moe):
            register_adapters(registry, family.ADAPTERS, AITER_PRIORITY)


@hookimpl
def hwrun_capabilities(target: Target) -> Capabilities:
    """Claims computed from what the Triton tier's validate accepts on the target: the AMD GPUs
    (their architecture decides fp8), else CPU tensors, which only Triton's interpreter
    serves. Without either, nothing is claimed. The AITER adapters add no claim (see notes)."""
    served = TRITON.claims(target)
    return Capabilities(
        ops=served.ops,
        formats=served.formats,
        features=served.features,
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        notes=(
            "gfx942 (MI300) computes FP8 in the FNUZ variant (float8_e4m3fnuz): the Triton "
            "kernels that read OCP e4m3fn codes (indexer logits, fp8_ds_mla decode) refuse it; "
            "gfx950 (MI355X) uses OCP e4m3fn and has native MXFP4.",
            "The Triton kernels pad heads in registers (any head count runs); the AITER MLA "
            "adapter pads heads to a multiple of 16, as AITER's kernels need.",
            "AITER adapters (registered when AMD's aiter imports) are not validated on hardware "
            "from this project: claims follow the Triton tier alone, so an AITER-only format "
            "(MXFP4 experts) is served but not claimed.",
            "The Triton kernels run with their H200-tuned defaults; not validated on AMD "
            "hardware from this project.",
        ),
    )
