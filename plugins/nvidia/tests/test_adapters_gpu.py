"""The DeepGEMM and FlashMLA adapters on a CUDA GPU against the references (DeepGEMM's paged and
ragged logits and fp8 linear, FlashMLA's sparse decode and prefill), each skipped without its
wheel.

Run on the H200 with ``PYTHONPATH=core:plugins/nvidia:. pytest plugins/nvidia/tests`` after
installing the wheels (../shared/tools/fetch-gpu-wheels.sh).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hwrun import knobs
from hwrun.formats.index_keys import get_index_key_format
from hwrun.ops import indexer as ref_indexer
from hwrun.ops import sparse_mla as ref_mla
from tests.kernels.gpu_inputs import check_mla, mla_inputs, paged_inputs, relative_error

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or knobs.triton_interpret(),
    reason="needs a CUDA GPU (the adapters call vendor kernels)",
)
needs_deepgemm = pytest.mark.skipif(
    importlib.util.find_spec("deep_gemm") is None, reason="DeepGEMM is not installed"
)
needs_flashmla = pytest.mark.skipif(
    importlib.util.find_spec("flash_mla") is None, reason="FlashMLA is not installed"
)


@needs_flashmla
@pytest.mark.parametrize("s", [1, 2])
def test_flashmla_decode_adapter(s):
    from hwrun_nvidia.flashmla import decode

    q, cache, slots, lengths, sink = mla_inputs("fp8_ds_mla", 4, s, 128, 2048)
    got = decode(q, cache, "fp8_ds_mla", slots, 0.07, lengths, sink)
    check_mla(got, ref_mla.decode(q, cache, "fp8_ds_mla", slots, 0.07, lengths, sink))


@needs_flashmla
def test_flashmla_decode_reuses_its_schedule_across_calls():
    """The adapter keeps FlashMLA's tile schedule per shape: later calls of the same shape with
    other data (shorter and empty rows included) still match the reference."""
    from hwrun_nvidia.flashmla import decode

    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        q, cache, slots, _, _ = mla_inputs("fp8_ds_mla", 8, 1, 64, 2048)
        slots[0, 0, 5:] = -1  # attends to 5 rows
        slots[1] = -1  # attends to nothing: out 0, LSE -inf
        got = decode(q, cache, "fp8_ds_mla", slots, 0.07)
        check_mla(got, ref_mla.decode(q, cache, "fp8_ds_mla", slots, 0.07))
        assert (got[0][1] == 0).all() and (got[1][1] == float("-inf")).all()


@needs_flashmla
def test_flashmla_prefill_adapter():
    from hwrun_nvidia.flashmla import prefill

    tokens, workspace, k = 64, 4096, 2048
    q = torch.randn(tokens, 128, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(workspace, 576, device="cuda", dtype=torch.bfloat16)
    indices = torch.randint(0, workspace, (tokens, k), device="cuda", dtype=torch.int32)
    indices[3, :] = -1
    got = prefill(q, kv, indices, 0.07)
    check_mla(got, ref_mla.prefill(q, kv, indices, 0.07))


@needs_deepgemm
@pytest.mark.parametrize("next_n,heads", [(1, 64), (2, 32)])
def test_deepgemm_paged_adapter(next_n, heads):
    from hwrun_nvidia.deepgemm import logits_paged

    q, w, cache, table, lens = paged_inputs("fp8", 4, 8192, heads, next_n, torch.float8_e4m3fn)
    got = logits_paged(q, w, cache, "fp8", table, lens, 8192)
    want = ref_indexer.logits_paged(q, w, cache, "fp8", table, lens, 8192)
    assert relative_error(got, want) < 2e-3


@needs_deepgemm
def test_deepgemm_ragged_adapter():
    from hwrun_nvidia.deepgemm import logits_ragged

    m, n = 256, 2048
    elements, scales = get_index_key_format("fp8").encode(torch.randn(n, 128, device="cuda"))
    q = torch.randn(m, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(m, 64, device="cuda")
    ks = torch.zeros(m, device="cuda", dtype=torch.int32)
    ke = torch.arange(n - m + 1, n + 1, device="cuda", dtype=torch.int32)
    got = logits_ragged(q, w, elements, scales, "fp8", ks, ke)
    assert (
        relative_error(got, ref_indexer.logits_ragged(q, w, elements, scales, "fp8", ks, ke)) < 2e-3
    )


def _replay_matches_eager(fn, make_inputs):
    """Capture ``fn`` on one set of inputs, refill them in place with fresh values and replay:
    the replay must give exactly what an eager call on the fresh values gives (no host value,
    no allocation or schedule fixed at capture that the new inputs invalidate)."""
    torch.manual_seed(0)
    static = make_inputs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*static)  # warm-up: compile, lazy initialisation
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static)
    torch.manual_seed(1)
    fresh = make_inputs()
    for old, new in zip(static, fresh, strict=True):
        if isinstance(old, torch.Tensor):
            old.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    want = fn(*fresh)
    for got, expected in zip(captured, want, strict=True):
        assert torch.equal(got, expected)


@needs_flashmla
def test_flashmla_decode_replays_from_a_cuda_graph():
    from hwrun_nvidia.flashmla import decode

    def inputs():
        q, cache, slots, lengths, _ = mla_inputs("fp8_ds_mla", 8, 1, 64, 2048)
        return q, cache, "fp8_ds_mla", slots, 0.07, lengths

    _replay_matches_eager(decode, inputs)


@needs_deepgemm
def test_deepgemm_paged_logits_replay_from_a_cuda_graph():
    from hwrun_nvidia.deepgemm import logits_paged

    def inputs():
        q, w, cache, table, lens = paged_inputs("fp8", 8, 8192, 64, 1, torch.float8_e4m3fn)
        lens = torch.randint(1, 8193, lens.shape, device="cuda", dtype=torch.int32)
        return q, w, cache, "fp8", table, lens, 8192

    _replay_matches_eager(lambda *a: (logits_paged(*a),), inputs)


def _fp8_weight(rows: int, cols: int):
    from hwrun.ops.quantized_weight import quantize_weight

    return quantize_weight(torch.randn(rows, cols, device="cuda") * 0.02, "fp8_block128")


@needs_deepgemm
@pytest.mark.parametrize("tokens", [1, 16, 64, 100, 512])
@pytest.mark.parametrize(
    "rows,cols", [(2240, 4096), (20480, 1536), (4096, 8192), (576, 1536), (160, 1536)]
)
def test_deepgemm_linear_a8w8_adapter(rows, cols, tokens):
    """The bench model's joined projections, o_proj and kv_a's 576 rows, a weight whose rows
    DeepGEMM's tiles do not cover evenly (160: the Triton kernel's), row counts on both sides of
    the crossover and a partial 64-row tile; an outlier and a zero group. Within
    test_gpu_kernels.py's a8w8 tolerance: both sides multiply the same e4m3 codes; DeepGEMM's
    tensor-core sums of a 128-wide K step stay well inside it at these ordinary scales (the
    conformance cases hold the extremes)."""
    from hwrun.ops.linear import linear_a8w8 as reference
    from hwrun_nvidia.deepgemm_linear import linear_a8w8, uses_deepgemm

    weight = _fp8_weight(rows, cols)
    x = (torch.randn(tokens, cols, device="cuda") * 0.1).to(torch.bfloat16)
    x[0, 3] = 300.0
    x[-1, 128:256] = 0
    got, want = linear_a8w8(x, weight), reference(x, weight)
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, rows)
    scale = float(want.float().abs().amax())
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-3 * scale)
    assert uses_deepgemm(tokens, weight) == (tokens >= 16 and rows % 64 == 0)


@needs_deepgemm
def test_deepgemm_linear_a8w8_replays_from_a_cuda_graph():
    from hwrun_nvidia.deepgemm_linear import linear_a8w8

    weight = _fp8_weight(4096, 8192)

    def inputs():
        return (torch.randn(64, 8192, device="cuda") * 0.1).to(torch.bfloat16), weight

    _replay_matches_eager(lambda *a: (linear_a8w8(*a),), inputs)
