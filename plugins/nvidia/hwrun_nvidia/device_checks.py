"""Reasons an NVIDIA implementation cannot serve a spec, shared by the op-family modules.

Each function returns a list of reasons (empty: fine), so validators concatenate them and a
refusal lists everything at once.
"""

from __future__ import annotations

import importlib.util
from functools import cache

from hwrun.kernels.triton.registration import TritonKernel
from hwrun.registry import OpSpec

TUNED_FOR = "defaults tuned on the H200"


@cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@cache
def importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a vendor library's import can
    take seconds and initialise CUDA)."""
    return importlib.util.find_spec(module) is not None


def _sm(arch: str | None) -> int | None:
    if arch is None or not arch.startswith("sm_"):
        return None
    digits = arch[3:].rstrip("af")
    return int(digits) if digits.isdigit() else None


def cuda_reasons(spec: OpSpec, min_sm: int = 80) -> list[str]:
    """The spec must run on a CUDA device of at least ``sm_<min_sm>``, and one must exist."""
    reasons = []
    if spec.device_type != "cuda":
        reasons.append(
            f"tensors are on {spec.device_type!r}; this NVIDIA kernel needs them on 'cuda'"
        )
    elif not _cuda_available():
        reasons.append("no CUDA device is visible to torch (torch.cuda.is_available() is False)")
    sm = _sm(spec.arch)
    if sm is not None and sm < min_sm:
        reasons.append(f"needs sm_{min_sm} or newer, the device is {spec.arch}")
    return reasons


def triton_device_reasons(spec: OpSpec, kernel: TritonKernel) -> list[str]:
    """A Triton kernel on a CUDA device: sm_80+, sm_89+ where it multiplies in fp8 (the fp8
    tensor cores); Triton converts OCP e4m3fn codes on every such architecture."""
    return cuda_reasons(spec, min_sm=89 if kernel.fp8_dot(spec) else 80)
