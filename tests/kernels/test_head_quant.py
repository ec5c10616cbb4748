"""head_products_quantize (the W_UV product with o_proj's input quantized in the same launch)
in the CPU interpreter: the values against fp32 per-head products rounded once, the codes and
scales byte-exact to hwrun.formats' quantization of the values as written, in both scale
layouts, with ue8m0, for 1, 5 and 70 tokens (one and two token tiles, masked rows), strided
inputs and an all-zero head."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.fp8 import quantize_fp8_groups
from hwrun.kernels.triton.head_quant import head_products_quantize


@pytest.mark.parametrize("tokens", [1, 5, 70])
@pytest.mark.parametrize("ue8m0,token_major", [(False, False), (True, True)])
def test_values_and_codes(tokens, ue8m0, token_major):
    g = torch.Generator().manual_seed(tokens)
    heads, latent = 3, 256
    # x as the attention writes it, seen through a wider buffer (a strided token dimension)
    x = torch.randn(tokens, heads, latent + 64, generator=g).to(torch.bfloat16)[..., :latent]
    w = (torch.randn(heads, 128, latent, generator=g) * 0.05).to(torch.bfloat16)
    x[:, 1] = 0  # an all-zero head: its groups take the floor scale
    values, (codes, scales) = head_products_quantize(x, w, ue8m0, token_major)
    want = torch.einsum("tha,hva->thv", x.float(), w.float()).reshape(tokens, -1)
    # fp32 sums in another order, then one bf16 rounding: within a bf16 unit
    torch.testing.assert_close(values.float(), want.bfloat16().float(), rtol=2**-7, atol=1e-6)
    assert values.dtype == torch.bfloat16 and values.shape == (tokens, heads * 128)
    want_codes, want_scales = quantize_fp8_groups(values.float(), 128, ue8m0=ue8m0)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    assert (scales.stride(0) == 1) == token_major


def test_refuses_what_it_cannot_compute():
    x = torch.zeros(2, 3, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"w must be bf16 \[H, V, A\] = \[3, 128, 256\]"):
        head_products_quantize(x, torch.zeros(3, 128, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="V must be 128"):
        head_products_quantize(x, torch.zeros(3, 64, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x must be bf16"):
        head_products_quantize(x.float(), torch.zeros(3, 128, 256))
