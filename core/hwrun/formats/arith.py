"""Arithmetic that gives the same bits on every device.

PyTorch's CUDA kernels turn ``tensor / python_float`` into a multiplication by the rounded
reciprocal (1/448, 1/6, 1/7.5 are inexact), so a scale computed that way can differ from the
CPU's by one ulp and move an element to the next code. Dividing by a 0-dim tensor on the same
device is a true IEEE division everywhere. NaN bit patterns differ too (CPU 0x7FC00000, CUDA
0x7FFFFFFF), so fp32 and bf16 values stored as bytes get one canonical quiet NaN.
"""

from __future__ import annotations

import torch

_CANONICAL_NAN = {torch.float32: (torch.int32, 0x7FC00000), torch.bfloat16: (torch.int16, 0x7FC0)}


def divide(numerator: torch.Tensor, denominator: float) -> torch.Tensor:
    """``numerator / denominator`` correctly rounded on any device."""
    return numerator / torch.tensor(denominator, dtype=numerator.dtype, device=numerator.device)


def divide_into(numerator: float, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` correctly rounded on any device."""
    top = torch.tensor(numerator, dtype=denominator.dtype, device=denominator.device)
    return top / denominator


def canonical_nan(x: torch.Tensor) -> torch.Tensor:  # [...] fp32 or bf16 -> same
    """x with every NaN replaced by the canonical quiet NaN (0x7FC00000 / 0x7FC0)."""
    # amax propagates NaN and is a fast vectorized reduction: the common case (no NaN) costs
    # one read instead of a mask and a copy.
    if x.numel() == 0 or not bool(torch.isnan(x.amax())):
        return x
    int_dtype, bits = _CANONICAL_NAN[x.dtype]
    nan = torch.tensor(bits, dtype=int_dtype, device=x.device)
    return torch.where(torch.isnan(x), nan, x.view(int_dtype)).view(x.dtype)
