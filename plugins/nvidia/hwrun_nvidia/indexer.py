"""The DSA indexer on NVIDIA: portable Triton logits (paged, ragged) and top-k; DeepGEMM logits
adapters above them.

Priorities: DeepGEMM (when it imports and the spec suits it) 20, Triton 10. DeepGEMM needs a
CUDA device; the Triton tier also runs on CPU tensors in Triton's interpreter. The paged
logits' defaults are the H200's: 4 warps per 64-token block, 4 cp.async stages, ~8 programs per
multiprocessor.
"""

from __future__ import annotations

from hwrun.kernels.triton.registration import register_family
from hwrun.registry import OpRegistry
from hwrun_nvidia import deepgemm
from hwrun_nvidia.device_checks import TUNED_FOR, triton_device_reasons


def register(registry: OpRegistry) -> None:
    register_family(registry, "indexer", triton_device_reasons, TUNED_FOR)
    deepgemm.register(registry)
