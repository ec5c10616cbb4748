"""Cache writes on AMD: the portable Triton quantize-and-scatter kernels. They compute e4m3 and
e2m1 bits with integer arithmetic, so the OCP fp8 rows they write are exact on gfx942 too."""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_amd.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "kv", triton_device_reasons, TUNED_FOR)
