"""ModelFunctions compiles rms_norm once per width: a renamed copy of its code per width, so
dynamo's automatic dynamic never sees two widths in one function (which made the width symbolic
and the H200's norms 4x slower). torch.compile is replaced by a recorder here; the compiled
kernels themselves are test_fused_gpu.py's."""

from __future__ import annotations

import torch

from hwrun.engine import fused


def test_one_compiled_copy_per_width(monkeypatch):
    compiled = []

    def record(fn):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(fused.torch, "compile", record)
    functions = fused.ModelFunctions(compiled=True)
    for rows in (64, 48, 1):
        for width in (4096, 1536):
            x = torch.randn(rows, width)
            weight = torch.randn(width)
            got = functions.rms_norm(x, weight, 1e-6)
            torch.testing.assert_close(got, fused.rms_norm(x, weight, 1e-6), rtol=0, atol=0)
    norms = [fn for fn in compiled if fn.__code__.co_name.startswith("rms_norm")]
    assert [fn.__code__.co_name for fn in norms] == ["rms_norm_width_4096", "rms_norm_width_1536"]
    assert norms[0].__code__ is not norms[1].__code__
    assert norms[0].__code__.co_code == fused.rms_norm.__code__.co_code  # the same function


def test_uncompiled_functions_are_the_functions_themselves():
    assert fused.ModelFunctions(compiled=False).rms_norm is fused.rms_norm
