"""Input checks shared by the format codecs: each failure says what shape or dtype was expected."""

from __future__ import annotations

import torch

FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def require_float(x: torch.Tensor, what: str, expected_shape: str) -> torch.Tensor:
    """Return ``x`` as float32 after checking it is a floating tensor; ``expected_shape`` names
    the shape the caller documents (e.g. "[..., N] with N a multiple of 32")."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(
            f"{what}: expected a torch.Tensor {expected_shape}, got {type(x).__name__}"
        )
    if x.dtype not in FLOAT_INPUTS:
        raise ValueError(
            f"{what}: expected a float32/bfloat16/float16 tensor {expected_shape}, got {x.dtype}"
        )
    return x.float()


def require_uint8(codes: torch.Tensor, what: str, expected_shape: str) -> torch.Tensor:
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise ValueError(f"{what}: expected a torch.uint8 tensor {expected_shape}, got {got}")
    return codes


def require_last_dim_multiple(x: torch.Tensor, block: int, what: str, expected_shape: str) -> int:
    """Check the last dimension is a positive multiple of ``block``; return it."""
    if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % block:
        raise ValueError(
            f"{what}: expected shape {expected_shape} (last dimension a multiple of {block}), "
            f"got {tuple(x.shape)}"
        )
    return x.shape[-1]


def require_shape(x: torch.Tensor, shape: tuple[int, ...], what: str, expected: str) -> None:
    """Check ``x.shape`` equals ``shape``, where -1 in ``shape`` matches any size."""
    ok = x.dim() == len(shape) and all(s in (-1, d) for s, d in zip(shape, x.shape, strict=True))
    if not ok:
        raise ValueError(f"{what}: expected shape {expected}, got {tuple(x.shape)}")
