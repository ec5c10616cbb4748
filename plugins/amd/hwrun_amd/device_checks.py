"""Reasons an AMD implementation cannot serve a spec, shared by the op-family modules.

Under ROCm, torch names the GPU's device type ``'cuda'`` too; ``torch.version.hip`` tells ROCm
from CUDA. FP8 differs by generation: gfx950 (CDNA4, MI355X) has OCP e4m3fn in hardware, gfx942
(CDNA3, MI300) computes FP8 as FNUZ (``float8_e4m3fnuz``: exponent bias 8, no negative zero,
NaN 0x80), so OCP e4m3fn codes mean other numbers there. The portable Triton kernels read the
stored e4m3fn codes through Triton's ``float8e4nv`` type, which Triton only emulates on gfx942;
that path is refused there rather than claimed unvalidated. The cache writes compute e4m3 bits
with integer arithmetic, so they serve every format on every architecture.
"""

from __future__ import annotations

from functools import cache

from hwrun.kernels.triton.registration import TritonKernel
from hwrun.registry import OpSpec

TUNED_FOR = "the kernels' defaults, tuned on the H200, not yet on CDNA"
OCP_FP8_ARCHS = ("gfx950",)
FNUZ_FP8_ARCHS = ("gfx942",)


@cache
def _rocm_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.version.hip is not None and torch.cuda.is_available()


def rocm_reasons(spec: OpSpec) -> list[str]:
    """The spec must run on a ROCm device (torch device type 'cuda' under ROCm), and one must
    exist."""
    if spec.device_type != "cuda":
        return [
            f"tensors are on {spec.device_type!r}; this AMD kernel needs them on the ROCm device "
            "(torch device type 'cuda' under ROCm)"
        ]
    if not _rocm_available():
        return [
            "no ROCm device is visible to torch (torch.version.hip is None or "
            "torch.cuda.is_available() is False)"
        ]
    return []


def triton_device_reasons(spec: OpSpec, kernel: TritonKernel) -> list[str]:
    """A Triton kernel on a ROCm device; OCP fp8 only where the hardware computes it."""
    reasons = rocm_reasons(spec)
    uses_e4m3fn = kernel.fp8_dot(spec) or kernel.reads_e4m3fn(spec)
    if uses_e4m3fn and spec.arch is not None and spec.arch not in OCP_FP8_ARCHS:
        what = (
            "computes FP8 as FNUZ (float8_e4m3fnuz)"
            if spec.arch in FNUZ_FP8_ARCHS
            else "has no OCP fp8 (e4m3fn) hardware"
        )
        reasons.append(
            f"{spec.arch} {what}; this Triton kernel reads OCP e4m3fn codes for "
            f"{kernel.op} (fp8 / mxfp4 index keys, fp8_ds_mla latents, fp8 queries, block-FP8 "
            f"weights, a8w8 activations) through "
            f"Triton's float8e4nv, only emulated there and not validated on hardware; "
            f"needs one of {list(OCP_FP8_ARCHS)}, or use bf16 latents"
        )
    return reasons


def device_arch(tensor) -> str | None:
    """The gfx architecture of the ROCm device ``tensor`` is on ("gfx942"), None elsewhere.
    Adapters convert at their boundary by it (FNUZ fp8 on gfx942)."""
    import torch

    if tensor.device.type != "cuda" or torch.version.hip is None:
        return None
    name = torch.cuda.get_device_properties(tensor.device).gcnArchName
    return name.split(":")[0]


def arch_reasons(spec: OpSpec, archs: tuple[str, ...], what: str) -> list[str]:
    """``what`` runs on ``archs`` only (a spec without an arch is not refused for it)."""
    if spec.arch is not None and spec.arch not in archs:
        return [f"{what} runs on {' / '.join(archs)} only, the device is {spec.arch}"]
    return []
