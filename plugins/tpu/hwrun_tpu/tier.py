"""The Pallas kernels as registrable impls: what each computes, where it may run, what the
platform claims.

Where: on a TPU (torch_xla tensors, device type ``"xla"``, with JAX's TPU backend) the kernels
would run compiled through Mosaic; off a TPU, CPU tensors are served only in one of Pallas's
interpreters (``HWRUN_PALLAS_INTERPRET``, see :mod:`hwrun_tpu.bridge`). No kernel has run on
TPU hardware yet: every impl's description says so, and so does the plugin's README, until one
has.

What: each :class:`PallasKernel` states its limits (formats, dtypes, head dims), the same
everywhere, and what it needs of a chip (``chip_limits``, asked with JAX's ``TpuInfo`` of the
Target's chip: its VMEM, SMEM, lanes). The platform's claims are asked of the same
``validate`` on its Target, so a machine without a TPU and without an interpret mode claims
nothing.

The host functions import their kernel module (and so JAX) at the first call: loading the
plugin imports neither, and a machine without JAX lists the reason instead.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwrun import knobs
from hwrun.kernels.triton.registration import TierClaims, claims_from_validate
from hwrun.registry import OpImpl, OpRegistry, OpSpec

if TYPE_CHECKING:
    from hwrun.target import Target

PALLAS_PRIORITY = 10
TPU_DEVICE_TYPE = "xla"  # torch_xla's device type, as hwrun.devices.detect_tpu_info reports it
VALIDATION = "not validated on hardware"


def _fits_every_chip(spec: OpSpec, chip: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class PallasKernel:
    """One op's Pallas kernel: its host function and what it can compute."""

    op: str
    fn: Callable[..., Any]
    limits: Callable[[OpSpec], list[str]]  # reasons it cannot serve a spec, on any device
    description: str
    formats: tuple[str, ...] = ()  # storage formats it reads or writes (the claim's candidates)
    # Reasons it cannot run on one TPU chip (JAX's TpuInfo of it: VMEM, SMEM, lanes), asked
    # only for specs on a TPU whose chip Pallas knows.
    chip_limits: Callable[[OpSpec, Any], list[str]] = _fits_every_chip
    # Each grid step computes one fixed shape from its own row's data: a row's result has the
    # same bits alone or in a batch (the conformance BATCH cases check it).
    batch_invariant: bool = True


def host_reasons(spec: OpSpec) -> list[str]:
    """JAX must import; CPU tensors only in an interpret mode; other devices must be a TPU."""
    reasons = []
    if importlib.util.find_spec("jax") is None:
        reasons.append("JAX is not installed (pip install 'hwrun-tpu[jax]')")
    if spec.device_type == "cpu":
        if not knobs.pallas_interpret():
            reasons.append(
                "tensors are on 'cpu': the Pallas kernels need a TPU, or Pallas's interpret "
                "mode (set HWRUN_PALLAS_INTERPRET=1)"
            )
    elif spec.device_type != TPU_DEVICE_TYPE:
        reasons.append(
            f"tensors are on {spec.device_type!r}: the Pallas kernels run on TPUs (torch_xla "
            f"tensors, device type {TPU_DEVICE_TYPE!r}) or in an interpret mode on 'cpu'"
        )
    return reasons


def chip_info(arch: str | None) -> Any:
    """JAX's ``TpuInfo`` (per TensorCore) of the chip tpu-info names (``"V6E"``, ``"v7x"``), or
    None when Pallas does not know it."""
    from jax.experimental.pallas import tpu as pltpu

    name = (arch or "").strip().lower().removeprefix("tpu").strip()
    for candidate in (name, name.removeprefix("v")):
        try:
            version = pltpu.ChipVersion(candidate)
        except ValueError:
            continue
        return pltpu.get_tpu_info_for_chip(version, 1)
    return None


def tpu_reasons(spec: OpSpec, kernel: PallasKernel) -> list[str]:
    """On a TPU: JAX must drive it, Pallas must know the chip, the kernel must fit it."""
    try:
        import jax

        backend = jax.default_backend()
    except Exception as exc:
        return [f"JAX could not start its backend ({type(exc).__name__}: {exc})"]
    if backend != "tpu":
        return [f"JAX's backend is {backend!r}: the kernels compile for its TPU backend only"]
    chip = chip_info(spec.arch)
    if chip is None:
        return [f"TPU {spec.arch!r} is not a chip this JAX's Pallas knows; upgrade JAX"]
    return kernel.chip_limits(spec, chip)


def validator(kernel: PallasKernel) -> Callable[[OpSpec], list[str]]:
    def validate(spec: OpSpec) -> list[str]:
        reasons = host_reasons(spec)
        if spec.device_type == TPU_DEVICE_TYPE and not reasons:
            reasons += tpu_reasons(spec, kernel)
        return reasons + kernel.limits(spec)

    return validate


@dataclass(frozen=True)
class PallasTier:
    """The kernels of :data:`hwrun_tpu.kernels.KERNELS` as the TPU platform registers and
    claims them."""

    kernels: tuple[PallasKernel, ...]

    def register(self, registry: OpRegistry) -> None:
        for kernel in self.kernels:
            registry.register(
                OpImpl(
                    op=kernel.op,
                    name="pallas",
                    platform=registry.platform,
                    fn=kernel.fn,
                    validate=validator(kernel),
                    priority=PALLAS_PRIORITY,
                    description=f"Pallas: {kernel.description} ({VALIDATION})",
                    batch_invariant=kernel.batch_invariant,
                )
            )

    def claims(self, target: Target) -> TierClaims:
        """What the kernels' own validate accepts on ``target`` (its device, else 'cpu'): an op
        whose spec with only the device filled in passes, and each of its formats that does."""
        return claims_from_validate(self.kernels, validator, target)
