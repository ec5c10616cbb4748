"""The Gluon ragged logits kernel (fp8 index keys) on an sm_90 GPU against the reference, on
fresh random keys: 64, 128, 32 and padded 10 heads; windows that cut tiles at different keys,
empty rows, a partial last row group and key array; spans of one tile to all of them, with even
and odd tile counts (an odd count scores one tile past the span's last, which must not be
stored); every ring depth; NaN bytes in every key no row's window holds; the bench shape
against the Triton kernel; and CUDA-graph replay. (Not registered: slower than the Triton
kernel on an H100, docs/benchmarks.md.)

Run on the H200 with ``PYTHONPATH=core:plugins/nvidia:. pytest plugins/nvidia/tests``.
"""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.index_keys import get_index_key_format
from hwrun.ops import indexer as ref_indexer
from tests.kernels.gpu_inputs import needs_sm90, relative_error

pytestmark = needs_sm90


def _kernel():
    return pytest.importorskip("hwrun_nvidia.gluon_ragged_logits")


def _inputs(m, n, heads, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    elements, scales = get_index_key_format("fp8").encode(
        torch.randn(n, 128, device="cuda", generator=g)
    )
    q = torch.randn(m, heads, 128, device="cuda", generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(m, heads, device="cuda", generator=g)
    ks = torch.randint(0, n, (m,), device="cuda", dtype=torch.int32, generator=g)
    ke = torch.randint(0, n + 1, (m,), device="cuda", dtype=torch.int32, generator=g)
    ks, ke = torch.minimum(ks, ke), torch.maximum(ks, ke)
    ke[0] = ks[0]  # an empty row
    return q, w, elements, scales, ks, ke


@pytest.mark.parametrize("stages", [2, 3, 4, 6])
@pytest.mark.parametrize("tiles", [1, 2, 3, 8, None])
@pytest.mark.parametrize("m,n,heads", [(300, 2000, 64), (37, 1000, 128), (9, 333, 32), (5, 64, 10)])
def test_matches_the_reference(m, n, heads, tiles, stages):
    q, w, elements, scales, ks, ke = _inputs(m, n, heads, m * n + heads)
    got = _kernel().logits_ragged(q, w, elements, scales, ks, ke, tiles=tiles, stages=stages)
    want = ref_indexer.logits_ragged(q, w, elements, scales, "fp8", ks, ke)
    assert relative_error(got, want) < 2e-3


def test_unread_keys_never_reach_a_logit():
    """0xFF bytes (NaN codes and NaN scales) in every key no row's window holds, inside and
    outside the rows' hull: selection, not arithmetic, keeps them out."""
    q, w, elements, scales, _, _ = _inputs(11, 200, 64, 12)
    ks = torch.tensor([0, 3, 40, 40, 70, 0, 150, 150, 199, 64, 100], dtype=torch.int32).cuda()
    ke = torch.tensor([1, 60, 41, 90, 130, 0, 200, 151, 200, 128, 164], dtype=torch.int32).cuda()
    read = torch.zeros(200, dtype=torch.bool, device="cuda")
    for start, end in zip(ks.tolist(), ke.tolist(), strict=True):
        read[start:end] = True
    elements, scales = elements.clone(), scales.clone()
    elements[~read], scales[~read] = 0xFF, 0xFF
    for tiles in (1, 2, None):
        got = _kernel().logits_ragged(q, w, elements, scales, ks, ke, tiles=tiles)
        want = ref_indexer.logits_ragged(q, w, elements, scales, "fp8", ks, ke)
        assert not got.isnan().any()
        assert relative_error(got, want) < 2e-3


def test_the_bench_shape_matches_triton():
    from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged as triton_ragged

    m, n, heads = 4096, 16384, 64
    q, w, elements, scales, _, _ = _inputs(m, n, heads, 3)
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = torch.arange(n - m + 1, n + 1, dtype=torch.int32, device="cuda")  # a causal chunk
    got = _kernel().logits_ragged(q, w, elements, scales, ks, ke)
    assert relative_error(got, triton_ragged(q, w, elements, scales, "fp8", ks, ke)) < 1e-5


def test_graph_replay_matches_eager():
    q, w, elements, scales, ks, ke = _inputs(64, 3000, 64, 4)
    kernel = _kernel()
    eager = kernel.logits_ragged(q, w, elements, scales, ks, ke)
    graph = torch.cuda.CUDAGraph()
    kernel.logits_ragged(q, w, elements, scales, ks, ke)  # compiled outside the capture
    with torch.cuda.graph(graph):
        captured = kernel.logits_ragged(q, w, elements, scales, ks, ke)
    q.copy_(torch.randn(q.shape, device="cuda").to(torch.float8_e4m3fn))
    graph.replay()
    again = kernel.logits_ragged(q, w, elements, scales, ks, ke)
    assert torch.equal(captured, again)
    assert not torch.equal(eager, again)
