"""The engine's RMSNorm with its output quantized in the same launch (norm_quant.py), in
Triton's interpreter: the norm as hwrun.engine.fused computes it (within a bf16 unit: the sum
of squares and the square root round in another order), the residual add exactly torch's, and
the codes and scales byte-exact to hwrun.formats of the norm's own output, in both layouts."""

from __future__ import annotations

import pytest
import torch

from hwrun.engine.fused import add_rms_norm, rms_norm
from hwrun.formats.fp8 import quantize_fp8_groups
from hwrun.kernels.triton.norm_quant import rms_norm_quantize


def _rows(seed: int, tokens: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, width, generator=g) * 2).to(torch.bfloat16)
    delta = (torch.randn(tokens, width, generator=g) * 0.5).to(torch.bfloat16)
    weight = (torch.rand(width, generator=g) + 0.5).to(torch.bfloat16)
    x[0, 7] = 300.0  # an outlier: its group's scale, the row's norm
    return x, delta, weight


def _within_a_bf16_unit(got: torch.Tensor, want: torch.Tensor) -> None:
    unit = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(2**-126)
    assert ((got.float() - want.float()).abs() <= unit).all()
    assert (got == want).float().mean() > 0.9  # mostly the same bits, not just close


@pytest.mark.parametrize("width", [4096, 1536, 384])  # hidden, q-LoRA, 3 groups (not a power of 2)
@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32_scales", "ue8m0_scales"])
@pytest.mark.parametrize("token_major", [False, True], ids=["row_major", "token_major"])
def test_norm_then_quantize_matches_the_norm_and_the_format(width, ue8m0, token_major):
    x, _, weight = _rows(40 + width, 5, width)
    h, y, (codes, scales) = rms_norm_quantize(x, weight, 1e-6, ue8m0, token_major)
    assert h is None and y.dtype == torch.bfloat16
    _within_a_bf16_unit(y, rms_norm(x, weight, 1e-6))
    want_codes, want_scales = quantize_fp8_groups(y.float(), 128, ue8m0=ue8m0)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    assert scales.is_contiguous() != token_major or x.shape[0] == 1


def test_the_residual_add_is_torchs_and_feeds_the_norm():
    x, delta, weight = _rows(41, 3, 1024)
    h, y, (codes, _) = rms_norm_quantize(x, weight, 1e-6, delta=delta)
    want_h, want_y = add_rms_norm(x, delta, weight, 1e-6)
    assert torch.equal(h, want_h)
    _within_a_bf16_unit(y, want_y)
    assert torch.equal(codes, quantize_fp8_groups(y.float(), 128)[0])


def test_no_rows_and_refusals():
    x, _, weight = _rows(42, 2, 256)
    _, y, (codes, scales) = rms_norm_quantize(x[:0], weight, 1e-6)
    assert y.shape == (0, 256) and codes.shape == (0, 256) and scales.shape == (0, 2)
    with pytest.raises(ValueError, match="C a multiple of 128"):
        rms_norm_quantize(x[:, :200], weight[:200], 1e-6)
    with pytest.raises(ValueError, match=r"weight must be torch.bfloat16 \[256\]"):
        rms_norm_quantize(x, weight.float(), 1e-6)
    with pytest.raises(ValueError, match="delta must be like x"):
        rms_norm_quantize(x, weight, 1e-6, delta=x[:1])
