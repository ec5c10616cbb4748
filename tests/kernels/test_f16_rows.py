"""f16_rows: bf16 activations as f16 with a power-of-two scale per row and 128 columns (CPU
interpreter). The scaled f16 values times their 2^-s must give back the bf16 values exactly
down to 2^-29 of each group's largest magnitude, and within 2^-39 of it below that."""

from __future__ import annotations

import torch

from hwrun.kernels.triton.f16_rows import GROUP, rows_to_f16


def _decoded(f16: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    per_column = scales.repeat_interleave(GROUP, dim=1)[:, : f16.shape[1]]
    return f16.double() * per_column.double()


def test_scaled_f16_gives_back_bf16_values_across_the_range():
    g = torch.Generator().manual_seed(1)
    hidden = 200  # a partial second group
    x = torch.randn(6, hidden, generator=g)
    x[1] *= 1e30  # far above f16's range
    x[2] *= 1e-30  # far below it
    x[3] *= torch.logspace(-15, 15, hidden)  # 30 decades inside a row
    x[4] = 0
    x[5, :GROUP] = 0  # one zero group beside a normal one
    want = x.to(torch.bfloat16).double()
    f16, scales = rows_to_f16(x)
    assert f16.dtype == torch.float16 and scales.shape == (6, 2)
    got = _decoded(f16, scales)
    group_max = want.abs().reshape(6, -1).new_zeros(6, 2)
    for group in range(2):
        group_max[:, group] = want[:, group * GROUP : (group + 1) * GROUP].abs().amax(1)
    bound = group_max.repeat_interleave(GROUP, dim=1)[:, :hidden]
    exact = want.abs() >= bound * 2.0**-29
    assert torch.equal(got[exact], want[exact])
    assert ((got - want).abs() <= bound * 2.0**-39).all()
    assert (f16.float().abs() < 2.0**15).all()  # never near f16's overflow


def test_without_the_scale_f16_would_lose_these_rows():
    # Negative control: plain f16 overflows the 1e30 row and flushes the 1e-30 row, so the
    # test above can tell a missing scale.
    x = torch.tensor([[1e30, -2e30], [1e-30, 3e-30]])
    plain = x.to(torch.bfloat16).to(torch.float16).double()
    assert not torch.isfinite(plain[0]).all() and (plain[1] == 0).all()
    f16, scales = rows_to_f16(x)
    assert torch.equal(_decoded(f16, scales), x.to(torch.bfloat16).double())
