"""attn.lse_combine on AMD: the portable Triton merge."""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_amd.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "attn", triton_device_reasons, TUNED_FOR)
