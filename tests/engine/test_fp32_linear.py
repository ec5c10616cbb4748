"""Fp32Linear: the router's and the indexer head weights' fp32 products. On the CPU it is the
fp32 product itself; on CUDA a bf16-valued weight is held in bf16 and multiplied by one bf16
GEMM accumulating in fp32, whose sums must equal the fp32 product's up to summation order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hwrun.engine.linears import Fp32Linear

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bf16_valued(rows: int, cols: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn(rows, cols, device=device).bfloat16().float()


def test_on_the_cpu_it_is_the_fp32_product():
    weight = _bf16_valued(64, 512)
    linear = Fp32Linear.load(weight)
    assert linear.weight.dtype == torch.float32  # no bf16 GEMM into fp32 on the CPU
    x = torch.randn(5, 3, 512).bfloat16()
    out = linear(x)
    assert out.dtype == torch.float32 and out.shape == (5, 3, 64)
    assert torch.equal(out, F.linear(x.float(), weight))
    rows = linear(x.view(15, 512), row_by_row=True)
    assert torch.equal(rows[7], F.linear(x.view(15, 512)[7:8].float(), weight)[0])


@cuda
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_a_bf16_valued_weight_takes_the_bf16_gemm_with_fp32_sums(rows):
    torch.manual_seed(rows)
    weight = _bf16_valued(64, 4096, "cuda")
    linear = Fp32Linear.load(weight)
    assert linear.weight.dtype == torch.bfloat16
    x = torch.randn(rows, 4096, device="cuda").bfloat16()
    out = linear(x)
    expected = F.linear(x.double(), weight.double())  # exact products, exact sums
    assert out.dtype == torch.float32
    # 4096 exact products summed in fp32 in some order: each partial sum rounds at most half
    # an ulp of its own size, so the error stays within ~4096 * 2^-24 of sum |x_i w_i|.
    bound = 4096 * 2.0**-24 * F.linear(x.double().abs(), weight.double().abs())
    assert ((out.double() - expected).abs() <= bound).all()
    assert torch.equal(linear(x, row_by_row=True)[0], F.linear(x[:1].float(), weight)[0])


@cuda
def test_a_weight_with_fp32_values_stays_fp32():
    weight = torch.randn(64, 256, device="cuda")
    weight[0, 0] = 1.0 + 2.0**-12  # not a bf16 value
    linear = Fp32Linear.load(weight)
    assert linear.weight.dtype == torch.float32
    x = torch.randn(8, 256, device="cuda").bfloat16()
    assert torch.equal(linear(x), F.linear(x.float(), weight))
