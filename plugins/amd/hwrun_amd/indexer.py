"""The DSA indexer on AMD: the portable Triton logits (paged, ragged) and top-k.

Any number of index heads: the kernels pad heads in registers to a power of two of at least 16
(the matrix units' smallest tile), so callers pad nothing. The logits read fp8 and mxfp4 keys as
OCP e4m3fn, refused on gfx942 (FNUZ fp8, see device_checks). No AITER adapter is registered:
none has been validated on hardware.
"""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_amd.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "indexer", triton_device_reasons, TUNED_FOR)
