"""Hooks of the Google TPU platform: its devices (through tpu-info) and the Pallas tier
(:mod:`hwrun_tpu.kernels`), none of it validated on TPU hardware yet.

The kernels follow the seeds' TPU path for DSA: the TensorCore scores the index keys
(:mod:`.indexer`), the SparseCore selects the top-k and gathers the chosen latent rows into a
dense buffer (:mod:`.topk`, :mod:`.gather`), and sparse MLA runs as dense attention over that
buffer (:mod:`.sparse_mla`). JAX is an optional dependency (``hwrun-tpu[jax]``); without it,
or off a TPU without ``HWRUN_PALLAS_INTERPRET=1``, every impl refuses with the reason.
"""

from __future__ import annotations

from hwrun.devices import detect_tpu_info
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun.registry import OpRegistry
from hwrun.target import Target
from hwrun_tpu.kernels import KERNELS
from hwrun_tpu.serve_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)
from hwrun_tpu.tier import PallasTier

NAME = "tpu"
PALLAS = PallasTier(KERNELS)


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="google",
        description="Google TPUs: Pallas kernels for the DSA path (not validated on hardware)",
        version="0.1.0",
    ),
    detect_tpu_info,
)


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    """The Pallas tier; JAX is imported at a kernel's first call, never at load."""
    PALLAS.register(registry)


@hookimpl
def hwrun_capabilities(target: Target) -> Capabilities:
    """Claims computed from what the kernels' validate accepts on the target: TPU devices, else
    CPU tensors, which only the interpret mode serves. Without either, nothing is claimed."""
    served = PALLAS.claims(target)
    return Capabilities(
        ops=served.ops,
        formats=served.formats,
        features=served.features,
        dtypes=frozenset({"bfloat16", "float32"}),
        notes=("Not validated on TPU hardware: checked in Pallas's TPU interpret mode only.",),
    )
