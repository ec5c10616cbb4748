"""Tensor descriptors (TMA) built inside kernels: the global scratch Triton asks for at launch.

A descriptor made with ``tl.make_tensor_descriptor`` lives in global memory (128 B a program)
that Triton requests from its allocator when the kernel launches. torch's caching allocator
serves it, so launches under CUDA graph capture take it from the graph's pool.
"""

from __future__ import annotations

import torch
import triton


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.uint8, device="cuda")


def nvidia_sm90_or_later(device: torch.device) -> bool:
    """An NVIDIA GPU of Hopper's generation or later (its tensor copy engine, its shared
    memory for deep pipelines), not ROCm and not the interpreter: what the defaults that use
    descriptors were tuned on."""
    return (
        device.type == "cuda"
        and torch.version.hip is None
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def use_torch_allocator() -> None:
    """Before a launch whose kernel builds tensor descriptors on a GPU."""
    triton.set_allocator(_scratch)


def tma_alignment_problems(name: str, tensor: torch.Tensor) -> list[str]:
    """Why a 2-D row-major ``tensor`` cannot be read through a tensor descriptor (the copy
    engine's rules: a 16-byte aligned base and row stride, unit column stride)."""
    problems = []
    row_bytes = tensor.stride(0) * tensor.element_size()
    if tensor.stride(-1) != 1 or row_bytes % 16 or tensor.data_ptr() % 16:
        problems.append(
            f"{name} needs a 16-byte aligned base and row stride and unit column stride for "
            f"tma, got strides {tuple(tensor.stride())} at address {tensor.data_ptr():#x}"
        )
    return problems
