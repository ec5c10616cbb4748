"""hwrun's patches of Triton's CPU interpreter: fp32 -> bf16 rounds to nearest even as the GPUs
(and torch) do, where the unpatched interpreter truncates; bf16 -> fp32 keeps subnormals; loop
bounds from runtime scalars; the language patched once a launch, not at every helper call."""

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


@triton.jit
def _doubled(x):
    return x * 2


@triton.jit
def _helper_calls(x_ptr, y_ptr):
    offs = tl.arange(0, 64)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(3):
        x = _doubled(x)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0))


@pytest.mark.skipif(not knobs.triton_interpret(), reason="patches the CPU interpreter only")
def test_a_launch_patches_the_language_once_and_restores_it(monkeypatch):
    """The launch patches triton.language once; its helper calls do not patch again, and once
    it is over tl is Triton's own again (what the next launch patches afresh)."""
    import triton.runtime.interpreter as interpreter

    prepare_launch()
    builtin_maximum = tl.maximum
    calls = []
    monkeypatch.setattr(interpreter, "_patch_builtin", _counting(interpreter._patch_builtin, calls))
    x = torch.randn(64)
    y = torch.empty_like(x)
    for launch in (1, 2):
        _helper_calls[(1,)](x, y)
        assert torch.equal(y, (x * 8).clamp(min=0)), launch
        assert tl.maximum is builtin_maximum, launch  # restored
    patches_a_launch = len(calls) // 2
    # tl, tl.tensor, tl.math and the descriptor base: once per launch, not per helper call
    assert patches_a_launch == 4, calls


def _counting(patch_builtin, calls):
    def counted(pkg, builder, scope):
        calls.append(getattr(pkg, "__name__", pkg))
        return patch_builtin(pkg, builder, scope)

    return counted
