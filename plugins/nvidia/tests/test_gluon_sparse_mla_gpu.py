"""The Gluon sparse MLA decode kernel (fp8_ds_mla rows) on an sm_90 GPU against the reference,
on fresh random rows: the Triton kernel's shapes (128, 64 and padded 20 heads, two query rows a
request, an empty row, invalid entries, top-k lengths, a sink), top-k lists that are not whole
tiles, every split and both ring depths, every e4m3 code decoded bit-exactly (one valid entry
a row: the output is that row's decoded NoPE values), the bench shape, CUDA-graph replay, and
the registry choosing it under HWRUN_GLUON=1 where FlashMLA is missing; each at 128 heads also
crossed over (a row's two programs one cluster, each decoding half of every tile for both).

Run on the H200 with ``PYTHONPATH=core:plugins/nvidia:. pytest plugins/nvidia/tests``.
"""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.latent import get_latent_format
from hwrun.ops import sparse_mla as ref_mla
from tests.kernels.gpu_inputs import check_mla, mla_inputs, needs_sm90

pytestmark = needs_sm90
FMT = "fp8_ds_mla"


def _kernel():
    return pytest.importorskip("hwrun_nvidia.gluon_sparse_mla")


crossed = pytest.mark.parametrize("crossover", [False, True], ids=["one-cta", "crossover"])


@crossed
@pytest.mark.parametrize("stages", [2, 1])
@pytest.mark.parametrize("batch,s,heads", [(4, 1, 128), (1, 1, 128), (2, 2, 64), (2, 1, 20)])
def test_matches_the_reference(batch, s, heads, stages, crossover):
    if crossover and heads != 128:
        pytest.skip("the crossover pairs 128 heads")
    torch.manual_seed(batch * heads + stages)
    q, cache, slots, lengths, sink = mla_inputs(FMT, batch, s, heads, 2048)
    got = _kernel().decode(q, cache, slots, 0.07, lengths, sink, stages=stages, crossover=crossover)
    check_mla(got, ref_mla.decode(q, cache, FMT, slots, 0.07, lengths, sink))


@crossed
@pytest.mark.parametrize("k,splits", [(100, 1), (100, 2), (1, None), (2048, 3), (2048, 32)])
def test_partial_tiles_and_splits(k, splits, crossover):
    torch.manual_seed(k + (splits or 0))
    q, cache, slots, _, sink = mla_inputs(FMT, 3, 1, 128, k)
    got = _kernel().decode(q, cache, slots, 0.07, None, sink, splits=splits, crossover=crossover)
    check_mla(got, ref_mla.decode(q, cache, FMT, slots, 0.07, None, sink))


@pytest.mark.parametrize(
    "heads,crossover", [(64, False), (128, True)], ids=["one-cta", "crossover"]
)
def test_every_code_decodes_exactly(heads, crossover):
    """Rows whose codes run through all 254 non-NaN e4m3 codes, scales from 2^-20 to 2^10 (and
    ones that round to bf16); each query row attends one valid entry, so its output is that
    entry's decoded NoPE values, bit for bit, and its LSE the scaled score."""
    torch.manual_seed(0)
    tokens = 64 * 8
    latent = get_latent_format(FMT)
    rows = latent.encode(
        torch.randn(tokens, 512, device="cuda"), torch.randn(tokens, 64, device="cuda")
    ).reshape(tokens, 656)
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    rows[:, :512] = codes[(torch.arange(tokens)[:, None] + torch.arange(512)) % len(codes)].cuda()
    scales = 2.0 ** torch.randint(-20, 11, (tokens, 4), device="cuda").float()
    scales[::3] *= 1.0 + torch.rand(tokens // 3 + 1, 4, device="cuda")[: scales[::3].shape[0]]
    rows[:, 512:528] = scales.contiguous().view(torch.uint8)
    cache = rows.reshape(tokens // 64, 64, 656)
    batch, k = 96, 130
    q = torch.randn(batch, 1, heads, 576, device="cuda", dtype=torch.bfloat16)
    slots = torch.full((batch, 1, k), -1, device="cuda", dtype=torch.int32)
    picks = torch.randperm(tokens, device="cuda")[:batch].to(torch.int32)
    slots[torch.arange(batch), 0, torch.arange(batch) % k] = picks  # in every tile position
    out, lse = _kernel().decode(q, cache, slots, 0.07, crossover=crossover)
    decoded = latent.decode(rows[picks.long()])  # [batch, 576] fp32
    want = decoded[:, :512].to(torch.bfloat16)
    assert torch.equal(out[:, 0], want[:, None, :].expand(-1, heads, -1))
    scores = q[:, 0].float() @ decoded.to(torch.bfloat16).float()[:, :, None]
    torch.testing.assert_close(lse[:, 0], scores[..., 0] * 0.07, atol=2e-3, rtol=2e-3)


@crossed
def test_the_bench_shape_matches_triton(crossover):
    """B=64, 128 heads, top-2048 over a 262144-token cache: the Triton kernel, checked against
    the reference at this shape elsewhere, as the oracle (the reference's per-row loop is slow)."""
    from hwrun.kernels.triton.sparse_mla import decode as triton_decode

    torch.manual_seed(1)
    tokens = 262144
    latent = get_latent_format(FMT)
    cache = latent.encode(
        torch.randn(tokens, 512, device="cuda"), torch.randn(tokens, 64, device="cuda")
    ).reshape(tokens // 64, 64, 656)
    q = torch.randn(64, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    slots = torch.randint(0, tokens, (64, 1, 2048), device="cuda", dtype=torch.int32)
    got = _kernel().decode(q, cache, slots, 576**-0.5, crossover=crossover)
    check_mla(got, triton_decode(q, cache, FMT, slots, 576**-0.5))


@crossed
def test_graph_replay_matches_eager(crossover):
    q, cache, slots, lengths, sink = mla_inputs(FMT, 4, 1, 128, 2048)
    kernel = _kernel()
    eager = kernel.decode(q, cache, slots, 0.07, lengths, sink, crossover=crossover)
    graph = torch.cuda.CUDAGraph()
    kernel.decode(q, cache, slots, 0.07, lengths, sink, crossover=crossover)  # compiled first
    with torch.cuda.graph(graph):
        captured = kernel.decode(q, cache, slots, 0.07, lengths, sink, crossover=crossover)
    slots.copy_(torch.randint_like(slots, 0, 64 * 512))
    graph.replay()
    again = kernel.decode(q, cache, slots, 0.07, lengths, sink, crossover=crossover)
    assert torch.equal(captured[0], again[0]) and torch.equal(captured[1], again[1])
    assert not torch.equal(eager[0], again[0])


def test_chosen_under_the_switch_where_flashmla_is_missing(monkeypatch):
    from hwrun.registry import OpRegistry, OpSpec
    from hwrun_nvidia import plugin

    monkeypatch.setattr("hwrun_nvidia.flashmla.importable", lambda name: False)
    monkeypatch.setenv("HWRUN_GLUON", "1")
    registry = OpRegistry("nvidia")
    plugin.hwrun_register_ops(registry)
    major, minor = torch.cuda.get_device_capability()
    spec = OpSpec(
        op="sparse_mla.decode",
        dtype="bfloat16",
        formats=(FMT,),
        head_dim=576,
        device_type="cuda",
        arch=f"sm_{major}{minor}",
    )
    assert registry.select(spec).impl.name == "gluon"
    q, cache, slots, lengths, sink = mla_inputs(FMT, 2, 1, 128, 512)
    impl = registry.select(spec).impl
    check_mla(
        impl.fn(q, cache, FMT, slots, 0.07, lengths, sink),
        ref_mla.decode(q, cache, FMT, slots, 0.07, lengths, sink),
    )
