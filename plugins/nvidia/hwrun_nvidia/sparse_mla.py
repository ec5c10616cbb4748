"""Sparse MLA on NVIDIA: the portable Triton decode (fp8_ds_mla and bf16 latents) under the
FlashMLA adapters.

The Triton decode's defaults are the H200's: 128 heads x 32 entries per step, each program
owning half of the 512 output columns, 8 warps; without spills (V_PARTS=4 spills at 64 heads).
"""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_nvidia import flashmla
from hwrun_nvidia.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "sparse_mla", triton_device_reasons, TUNED_FOR)
    flashmla.register(registry)
