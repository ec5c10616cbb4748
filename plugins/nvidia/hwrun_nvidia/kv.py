"""Cache writes on NVIDIA: the portable Triton quantize-and-scatter kernels."""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_nvidia.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "kv", triton_device_reasons, TUNED_FOR)
