"""The FlashMLA adapter's conversion of its LSE and empty rows to the contract, on fake
FlashMLA outputs (Triton's interpreter on CPU, the GPU where there is one): FlashMLA writes
``lse [B, H, s]`` with +inf (or NaN) where a row attended nothing; the contract wants ``[B, s,
H]``, -inf there and the row's output zeroed."""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun_nvidia.flashmla import lse_to_contract

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("batch", "s", "heads", "width"), [(3, 1, 64, 512), (2, 2, 128, 512), (5, 1, 16, 96)]
)
def test_lse_to_contract(batch, s, heads, width):
    prepare_launch()
    g = torch.Generator().manual_seed(batch * 100 + heads)
    out = torch.randn(batch, s, heads, width, generator=g).to(DEVICE, torch.bfloat16)
    lse = torch.randn(batch, heads, s, generator=g)
    empty = torch.rand(batch, heads, s, generator=g) < 0.1
    empty[0, :, 0] = True  # a whole (b, s) with nothing attended
    nan = torch.rand(batch, heads, s, generator=g) < 0.3
    lse = torch.where(empty, torch.where(nan, float("nan"), float("inf")), lse).to(DEVICE)
    before = out.clone()

    got = lse_to_contract(out, lse)

    want = torch.where(empty.to(DEVICE), float("-inf"), lse).permute(0, 2, 1)
    assert got.shape == (batch, s, heads)
    assert torch.equal(got, want)
    zeroed = empty.permute(0, 2, 1).to(DEVICE)[..., None]
    assert torch.equal(out, torch.where(zeroed, torch.zeros_like(before), before))
