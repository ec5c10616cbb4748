"""Sparse MLA on AMD: the portable Triton decode (bf16 latents everywhere, fp8_ds_mla where the
hardware computes OCP fp8: gfx950).

Heads: AITER's MLA decode kernels want the head count padded to a multiple of 16; the Triton
decode computes blocks of 128 heads in registers, masked, so 10 or 64 heads run as they
are. No AITER / FlyDSL adapter is registered: none has been validated on hardware.
"""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_amd.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "sparse_mla", triton_device_reasons, TUNED_FOR)
