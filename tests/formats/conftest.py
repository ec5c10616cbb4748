"""Independent oracles the format tests compare against (never hwrun itself)."""

import ml_dtypes
import numpy as np
import pytest
import torch


def ml_codes(x: torch.Tensor, dtype) -> torch.Tensor:
    """Codes of x (float32) as ml_dtypes rounds them (RNE), as a uint8 tensor."""
    return torch.from_numpy(x.float().numpy().astype(dtype).view(np.uint8).copy())


def ml_values(codes: torch.Tensor, dtype) -> torch.Tensor:
    return torch.from_numpy(codes.numpy().view(dtype).astype(np.float32))


E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn
E8M0 = ml_dtypes.float8_e8m0fnu


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def spread(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Random values over many binades (normal * 2^U(-12, 12)), the hard case for scales."""
    mant = torch.randn(*shape, generator=gen)
    return mant * torch.exp2(torch.randint(-12, 13, shape, generator=gen).float())


E4M3FNUZ = ml_dtypes.float8_e4m3fnuz
