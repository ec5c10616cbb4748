"""Hooks of the Alibaba T-HEAD Zhenwu PPU platform: its devices through T-HEAD's SAIL torch
(:mod:`hwrun_ppu.device_checks`, the model as the arch), the portable Triton tier from hwrun's
core on the PPU's CUDA-compatible device with the PPU's limits (no fp8 products on the 810E,
Triton >= 3.4), including the W4A16 MoE (``moe.experts`` with ``int4_g128`` weights and bf16
activations, the 810E's MoE backend in the day-0 post), and the deployment rules of the layouts
T-HEAD validated (:mod:`hwrun_ppu.serve_recipe`). Not validated on PPU hardware from this
project; on CPU the tier runs in Triton's interpreter like the NVIDIA and AMD plugins'.
"""

from __future__ import annotations

from hwrun.hookspecs import hookimpl
from hwrun.kernels.triton.registration import TritonTier
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun.registry import OpRegistry
from hwrun.target import Target
from hwrun_ppu.device_checks import TUNED_FOR, detect, triton_device_reasons
from hwrun_ppu.serve_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)

NAME = "ppu"
TRITON = TritonTier(triton_device_reasons, TUNED_FOR)


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="alibaba",
        description="Alibaba T-HEAD Zhenwu PPU (M890, 810E): portable Triton tier, W4A16 MoE",
        version="0.2.0",
    ),
    detect,
)


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """The Triton tier; kernels are imported at the first call, so loading the plugin stays
    cheap and works without a PPU."""
    TRITON.register(registry)


@hookimpl
def hwrun_capabilities(target: Target) -> Capabilities:
    """Claims computed from what the Triton tier's validate accepts on the target: the PPUs
    (their model decides fp8), else CPU tensors, which only Triton's interpreter serves."""
    served = TRITON.claims(target)
    return Capabilities(
        ops=served.ops,
        formats=served.formats,
        features=served.features,
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        notes=(
            "The 810E has no fp8 tensor-core products: fp8 indexer queries are refused there "
            "(bf16 queries run); the MoE runs W4A16 (int4 group-128 weights, bf16 activations).",
            "Not validated on PPU hardware from this project: the Triton kernels run with their "
            "H200-tuned defaults.",
        ),
    )
