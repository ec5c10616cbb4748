"""The model's fused torch pieces, compiled by torch.compile on CUDA, against the same functions
run eagerly (the CPU engine's code): equal up to the bf16 roundings a fused kernel may skip."""

from __future__ import annotations

import pytest
import torch

from hwrun import knobs
from hwrun.engine.fused import ModelFunctions

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or knobs.triton_interpret(), reason="needs a CUDA GPU"
)


def _close(got, want):
    for g, w in zip(
        got if isinstance(got, tuple) else (got,),
        want if isinstance(want, tuple) else (want,),
        strict=True,
    ):
        assert g.dtype == w.dtype and g.shape == w.shape
        # one bf16 rounding apart at most (2^-8 relative), measured against each tensor's scale
        assert (g.float() - w.float()).abs().max() <= 2**-7 * w.float().abs().max()


@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_compiled_functions_match_eager(tokens):
    eager, compiled = ModelFunctions(compiled=False), ModelFunctions(compiled=True)
    g = torch.Generator(device="cuda").manual_seed(tokens)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    cos, sin = randn(tokens, 64), randn(tokens, 64)
    cases = [
        ("rms_norm", (randn(tokens, 4096), randn(4096), 1e-6)),
        ("add_rms_norm", (randn(tokens, 4096), randn(tokens, 4096), randn(4096), 1e-6)),
        ("latent_and_key_rope", (randn(tokens, 576), randn(512), cos, sin, 1e-6)),
        (
            "index_query",
            (randn(tokens, 8, 128), randn(tokens, 8, dtype=torch.float32), cos, sin, False),
        ),
        ("index_key", (randn(tokens, 128), randn(128), randn(128), cos, sin, 1e-6)),
    ]
    for name, args in cases:
        _close(getattr(compiled, name)(*args), getattr(eager, name)(*args))
    # mla_query_rope writes into its first argument: each into a copy of one query
    q_mla, q_rope = randn(tokens, 8, 576), randn(tokens, 8, 64)
    got, want = q_mla.clone(), q_mla.clone()
    compiled.mla_query_rope(got, q_rope, cos, sin)
    eager.mla_query_rope(want, q_rope, cos, sin)
    assert torch.equal(got[..., :512], q_mla[..., :512])
    _close(got, want)
    q, w = randn(tokens, 8, 128), randn(tokens, 8, dtype=torch.float32).abs()
    codes, folded = compiled.index_query(q, w, cos, sin, True)
    want_codes, want_folded = eager.index_query(q, w, cos, sin, True)
    assert codes.dtype == torch.float8_e4m3fn
    # the decoded query times its folded weight is the same score scale either way
    _close(folded, want_folded)
    assert (codes.float() - want_codes.float()).abs().max() <= 32  # one e4m3 step near 448
