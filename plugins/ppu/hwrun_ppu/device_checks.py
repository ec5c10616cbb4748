"""The PPU's devices with their model as the architecture, and the reasons a Triton kernel
cannot run on one.

SAIL torch (T-HEAD's PyTorch build) exposes the PPUs as ``torch.cuda`` devices and leaves their
architecture unnamed (:func:`hwrun.devices.detect_ppu`); the model in the device name is what
decides the limits, so :func:`detect` records it as the arch (``"810E"``, ``"M890"``).

Limits of the portable Triton tier on a PPU:

- no fp8 tensor-core products on the 810E: kernels that multiply in fp8 (fp8 indexer queries)
  are refused there, and on the M890 too, whose fp8 no source of this project documents;
  everything else multiplies bf16 (the W4A16 MoE: int4 codes widened to bf16 in the kernel);
- SAIL ships its own, older Triton build: hwrun's kernels are written and tested against
  Triton >= 3.4 (``tl.histogram`` with a mask, ``tl.join`` / ``tl.split``), so an older Triton
  is refused with its version rather than left to fail while compiling;
- an unknown PPU model is treated like the 810E (the safe side) and named in the reason.

Not validated on PPU hardware from this project: the rules come from the vLLM day-0 post
(810E and M890 layouts, W4A16 on the 810E) and from what the kernels need.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from functools import cache

from hwrun.devices import detect_ppu
from hwrun.kernels.triton.registration import TritonKernel
from hwrun.platform import DeviceInfo
from hwrun.registry import OpSpec

MODELS = ("810E", "M890")  # the PPU models of the day-0 post, as their names carry them
NO_FP8_MATRIX = ("810E",)  # documented without fp8 tensor-core products
MIN_TRITON = (3, 4)
TUNED_FOR = "the kernels' defaults, tuned on the H200, not on a PPU"


def model_of(name: str) -> str | None:
    """The PPU model a device name carries ("Zhenwu 810E" -> "810E"), None if unknown."""
    upper = name.upper()
    return next((model for model in MODELS if model in upper), None)


def detect() -> list[DeviceInfo]:
    """:func:`hwrun.devices.detect_ppu`, each device's model recorded as its arch."""
    return [dataclasses.replace(d, arch=d.arch or model_of(d.name)) for d in detect_ppu()]


@cache
def _sail_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(getattr(torch.version, "sail", None)) and torch.cuda.is_available()


@cache
def triton_version() -> tuple[int, ...] | None:
    """The installed Triton's (major, minor), None when it is not installed."""
    try:
        text = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def ppu_reasons(spec: OpSpec) -> list[str]:
    """The spec must run on a PPU (torch device type 'cuda' under SAIL torch), and one must
    exist."""
    if spec.device_type != "cuda":
        return [
            f"tensors are on {spec.device_type!r}; this PPU kernel needs them on the PPU "
            "(torch device type 'cuda' under SAIL torch)"
        ]
    if not _sail_available():
        return [
            "no PPU is visible to torch (torch.version.sail is not set or "
            "torch.cuda.is_available() is False): install T-HEAD's SAIL torch"
        ]
    return []


def triton_device_reasons(spec: OpSpec, kernel: TritonKernel) -> list[str]:
    """A Triton kernel on a PPU: Triton new enough, fp8 products only where the model has them."""
    reasons = ppu_reasons(spec)
    version = triton_version()
    if version is not None and version < MIN_TRITON:
        want = ".".join(map(str, MIN_TRITON))
        reasons.append(
            f"Triton {'.'.join(map(str, version))} is installed (SAIL's own build); hwrun's "
            f"Triton kernels need >= {want} (tl.histogram with a mask, tl.join / tl.split): "
            f"install a Triton >= {want} that targets the PPU"
        )
    if kernel.fp8_dot(spec):
        why = (
            f"the {spec.arch} has no fp8 tensor-core products"
            if spec.arch in NO_FP8_MATRIX
            else f"fp8 tensor-core products on {spec.arch or 'an unknown PPU model'} are not "
            "documented in any source of this project, so they are not used"
        )
        reasons.append(
            f"{kernel.op} multiplies in fp8 here (fp8 queries, or a8w8's e4m3 activations), "
            f"and {why}: pass bf16 queries / activations"
        )
    return reasons
