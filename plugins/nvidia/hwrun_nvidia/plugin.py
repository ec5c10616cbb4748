"""Hooks of the NVIDIA platform: the portable Triton tier (core's kernels, Hopper defaults)
under the DeepGEMM and FlashMLA adapters (:mod:`hwrun_nvidia.deepgemm`, :mod:`.deepgemm_linear`,
:mod:`.flashmla`) and, with ``HWRUN_GLUON=1``, the Gluon kernels (:mod:`hwrun_nvidia.gluon`).

Priorities: a vendor adapter (when its library imports and the spec suits it) 20, Triton 10
(to_slots and moe.route included, one launch each), the graph-safe torch impls of to_slots and
moe.route (CUDA only) 5, kept under Triton for a pin or a spec the Triton tier refuses.
The adapters need a CUDA device; the Triton tier also runs on CPU tensors in Triton's
interpreter. The kernels' defaults are the H200's: the paged indexer logits run 4 warps per
64-token block with 4 cp.async stages (~8 programs per multiprocessor); the sparse MLA decode
takes 128 heads x 32 entries per step, each program owning half of the 512 output columns,
8 warps, without spills.
"""

from __future__ import annotations

from hwrun.devices import detect_nvml
from hwrun.hookspecs import hookimpl
from hwrun.kernels.torch_tier import register_torch_tier
from hwrun.kernels.triton.registration import TritonTier
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun.registry import OpRegistry
from hwrun.target import Target
from hwrun_nvidia import deepgemm, deepgemm_linear, flashmla, gluon
from hwrun_nvidia.device_checks import TUNED_FOR, triton_device_reasons
from hwrun_nvidia.serve_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)

NAME = "nvidia"
TRITON = TritonTier(triton_device_reasons, TUNED_FOR)

# Impls that passed `hwrun conformance --platform nvidia` on an H200 (sm_90), every one of them
# in the full run of commit 6735178 (2026-12-01, docs/benchmarks.md: conformant, 287 run, 284
# passed, 3 quality warnings); the Triton and torch tiers first in the run of 98f5016
# (docs/results/nvidia-h200), DeepGEMM and FlashMLA in that of 7f8d936, DeepGEMM's
# dense.linear_a8w8 in the full run of 585d933 (2026-12-04: conformant, 311 run, 304 passed, 3
# quality warnings); the Gluon sparse_mla.decode on an H100 (also sm_90) on 2026-12-06 with
# HWRUN_GLUON=1 and no FlashMLA (51 run, 51 passed), the Gluon indexer.topk on an H100 on
# 2026-12-07 (--ops indexer.topk --quick, with and without its compaction: 34 run, 34 passed).
# Blackwell has run nothing yet.
HARDWARE_VALIDATED = tuple(
    (op, impl, "sm_90")
    for impl, ops in (
        (
            "triton",
            (
                "attn.lse_combine",
                "dense.linear",
                "dense.linear_a8w8",
                "indexer.logits_paged",
                "indexer.logits_ragged",
                "indexer.to_slots",
                "indexer.topk",
                "kv.write_index_keys",
                "kv.write_latent",
                "moe.experts",
                "moe.route",
                "sparse_mla.decode",
                "sparse_mla.prefill",
            ),
        ),
        ("torch", ("indexer.to_slots", "moe.route")),
        ("deepgemm", ("dense.linear_a8w8", "indexer.logits_paged", "indexer.logits_ragged")),
        ("flashmla", ("sparse_mla.decode", "sparse_mla.prefill")),
        ("gluon", ("indexer.logits_paged", "indexer.topk", "sparse_mla.decode")),
    )
    for op in ops
)


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="nvidia",
        description="NVIDIA GPUs (Hopper, Blackwell): Triton tier + DeepGEMM/FlashMLA adapters",
        version="0.1.0",
    ),
    detect_nvml,
)


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """The Triton tier (Hopper tuning), the vendor-library adapters above it. Kernels and
    vendor libraries are imported at the first call, so loading the plugin stays cheap and
    works without a GPU."""
    TRITON.register(registry)
    register_torch_tier(registry)  # graph-safe to_slots / moe.route under Triton's
    deepgemm.register(registry)
    deepgemm_linear.register(registry)
    flashmla.register(registry)
    gluon.register(registry)  # behind HWRUN_GLUON


@hookimpl
def hwrun_capabilities(target: Target) -> Capabilities:
    """Claims computed from what the Triton tier's validate accepts on the target: the NVIDIA
    GPUs, else CPU tensors, which only Triton's interpreter serves. Without either, nothing is
    claimed (the vendor adapters sit on the same ops, so they add no op of their own)."""
    served = TRITON.claims(target)
    return Capabilities(
        ops=served.ops,
        formats=served.formats,
        features=served.features,
        dtypes=frozenset({"bfloat16", "float16", "float32", "float8_e4m3fn"}),
        notes=("FP4 tensor-core math needs Blackwell (sm_100+); Hopper reads FP4 as data.",),
        hardware_validated=HARDWARE_VALIDATED,
    )
