"""attn.lse_combine Triton kernel against the reference (CPU interpreter)."""

from __future__ import annotations

import torch

from hwrun.kernels.triton.lse_combine import lse_combine
from hwrun.ops.attn import lse_combine as reference


def test_lse_combine_matches_reference_with_empty_parts():
    g = torch.Generator().manual_seed(0)
    outs = torch.randn(3, 2, 4, 40, generator=g)
    lses = torch.randn(3, 2, 4, generator=g) * 4
    lses[1, 0, 0] = float("-inf")
    outs[1, 0, 0] = float("nan")  # an empty part's output is ignored, NaN included
    lses[:, 1, 2] = float("-inf")  # every part empty: out 0, lse -inf
    got_out, got_lse = lse_combine(outs, lses)
    want_out, want_lse = reference(outs, lses)
    torch.testing.assert_close(got_out, want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, atol=1e-6, rtol=1e-6)
    assert got_lse[1, 2] == float("-inf") and got_out[1, 2].eq(0).all()
