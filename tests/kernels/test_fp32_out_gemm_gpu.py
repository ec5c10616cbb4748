"""fp32_out_mm compiled on a CUDA GPU, at the engine's shapes: the bench model's router and
indexer head weights [64, 4096], DeepSeek-V3's router [256, 7168].

Skipped on machines without a CUDA device (CI); run on the H200 with
``PYTHONPATH=core pytest tests/kernels/test_fp32_out_gemm_gpu.py``.

Tolerance: every product of two bf16 values is exact in fp32, so each result differs from the
exact sum (float64 here) by its fp32 additions only. Rounded to nearest, K of them stay within
``K * 2^-24 * sum |x w|``; the tensor cores' fp32 accumulation may truncate instead (up to an
ulp an addition), so the bound allowed each GEMM is twice that.
"""

from __future__ import annotations

import pytest
import torch

from hwrun import knobs
from hwrun.kernels.triton.fp32_out_gemm import fp32_out_mm

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or knobs.triton_interpret(),
    reason="needs a CUDA GPU and compiled Triton (the interpreter tests cover CPU)",
)

SHAPES = [(64, 4096), (256, 7168)]  # (N, K)


def _operands(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    return x, weight


def _within_fp32_rounding(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> bool:
    exact = x.double() @ weight.double().T
    bound = 2 * x.shape[1] * 2.0**-24 * (x.double().abs() @ weight.double().abs().T)
    return bool(((got.double() - exact).abs() <= bound).all())


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 8, 64])
def test_matches_cublas_and_the_fp32_product(m, n, k):
    x, weight = _operands(m, n, k)
    got = fp32_out_mm(x, weight)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    cublas = torch.mm(x, weight.t(), torch.float32)
    fp32 = x.float() @ weight.float().T
    for result in (got, cublas, fp32):
        assert _within_fp32_rounding(result, x, weight)
    # the three agree to fp32 summation order (a relative error near 2^-24 * sqrt(K))
    scale = float(fp32.abs().amax())
    torch.testing.assert_close(got, cublas, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(got, fp32, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 8, 64])
def test_repeated_calls_give_the_same_bits(m, n, k):
    # Whichever split of a tile finishes last adds the partials in split order.
    x, weight = _operands(m, n, k, seed=1)
    first = fp32_out_mm(x, weight)
    for _ in range(20):
        assert torch.equal(fp32_out_mm(x, weight), first)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 64])
def test_graph_replays_give_the_eager_bits(m, n, k):
    x, weight = _operands(m, n, k, seed=2)
    eager = fp32_out_mm(x, weight)
    static_x = x.clone()
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):  # compiles outside the capture
        fp32_out_mm(static_x, weight)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fp32_out_mm(static_x, weight)
    for _ in range(3):  # each replay must find the counters it left at zero
        graph.replay()
        assert torch.equal(static_out, eager)
    fresh, _ = _operands(m, n, k, seed=3)
    static_x.copy_(fresh)
    graph.replay()
    assert torch.equal(static_out, fp32_out_mm(fresh, weight))
