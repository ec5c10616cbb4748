"""hwrun's patches of Triton's CPU interpreter: fp32 -> bf16 rounds to nearest even as the GPUs
(and torch) do, where the unpatched interpreter truncates; bf16 -> fp32 keeps subnormals; loop
bounds from runtime scalars."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from hwrun import knobs
from hwrun.kernels.triton.interpreter import (
    bf16_round_to_nearest_even,
    bf16_widen,
    prepare_launch,
)

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 3.3961776e38, 1e-40, 1.00390625]


def test_rounding_matches_torch_bit_for_bit():
    values = torch.cat((torch.randn(4096) * 1e3, torch.tensor(SPECIAL)))
    got = bf16_round_to_nearest_even(values.numpy())
    want = values.to(torch.bfloat16).view(torch.uint16).numpy()
    nan = values.isnan().numpy()
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(bf16_widen(got[nan])).all()  # NaN payloads differ between libraries
    widened = values.to(torch.bfloat16).float().numpy()
    assert np.array_equal(bf16_widen(want), widened, equal_nan=True)


@triton.jit
def _to_bf16_and_back(x_ptr, y_ptr, n):
    for start in range(0, n, 256):  # a runtime bound: the interpreter's __index__ patch
        offs = start + tl.arange(0, 256)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, x.to(tl.bfloat16).to(tl.float32), mask=offs < n)


@pytest.mark.skipif(not knobs.triton_interpret(), reason="patches the CPU interpreter only")
def test_interpreted_kernel_rounds_as_a_gpu():
    x = torch.cat((torch.randn(1000), torch.tensor(SPECIAL[1:])))
    y = torch.empty_like(x)
    prepare_launch()
    _to_bf16_and_back[(1,)](x, y, x.numel())
    assert torch.equal(y, x.to(torch.bfloat16).float())
