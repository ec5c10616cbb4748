"""The Gluon top-k kernels (hwrun_nvidia.gluon_topk) on an sm_90 GPU: in _threshold's place the
search must write the very same T, live-segment list and count, and zero the candidate counts,
for every row; in _compact_live's, the same candidates (in the atomics' order) and counts; in
select_candidates' place the select must write the same output, in the same
order (short rows, half and full tiles, the overflow slow path); and the top-k must be the
reference's set. Rows: indexer-like scores at
the bench's shapes, the engine's 32782-column rows (a tail past M), windows around M + SLACK
with the best scores in the tail, short, empty and clamped windows, ties (whole rows equal, so
the bracket leaves nothing to search), NaN and infinities.

Run on the H200 with ``PYTHONPATH=core:plugins/nvidia:. pytest plugins/nvidia/tests``.
"""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton import topk_threshold
from hwrun.kernels.triton.topk_threshold import TopkKernels
from hwrun.ops.topk import topk as reference
from tests.kernels.gpu_inputs import indexer_like_logits, needs_sm90, sets_equal

pytestmark = needs_sm90
I32 = torch.int32


def _kernel():
    return pytest.importorskip("hwrun_nvidia.gluon_topk")


def _both(record):
    """Kernels for topk_threshold.topk that run each Triton kernel into copies of the outputs,
    then the Gluon one into the real ones, and record both (before the next kernel changes
    them)."""
    from hwrun.kernels.triton.topk_select import select_candidates

    gluon_topk = _kernel()

    def threshold(rows, seg_max, outputs, L, k, M, slack, levels, bits):
        want = tuple(o.clone() for o in outputs)
        topk_threshold._threshold[(seg_max.shape[0],)](
            *rows, seg_max, *want, L, k, M, slack, levels, bits, True, False, False, True, 8,
            num_warps=8,
        )  # fmt: skip
        assert gluon_topk.threshold(rows, seg_max, outputs, L, k, M, slack, levels, bits)
        record["threshold"] = (rows, want, tuple(o.clone() for o in outputs))
        return True

    def compact(logits, rows, live, nlive, thresh, counts, cand, L, k, M, slack, levels, cap,
                block, parts):  # fmt: skip
        want_counts, want_cand = counts.clone(), cand.clone()
        topk_threshold._compact_live[(logits.shape[0], parts)](
            logits, *rows, live, nlive, thresh, want_counts, want_cand[0], want_cand[1],
            logits.stride(0), L, k, M, slack, levels, cap, block, num_warps=8,
        )  # fmt: skip
        assert gluon_topk.compact(
            logits, rows, live, nlive, thresh, counts, cand, L, k, M, slack, levels, cap, block,
            parts,
        )  # fmt: skip
        record["compact"] = (want_counts[:, 0], want_cand, counts[:, 0].clone(), cand.clone(), cap)
        return True

    def select(logits, rows, thresh, counts, cand, out, L, k, cap, idx_bits, block, k_block):
        want = out.clone()
        select_candidates[(logits.shape[0],)](
            logits, *rows, thresh, counts, cand[0], cand[1], want, logits.stride(0), L, k, cap,
            idx_bits, block, k_block, False, False, True, 8, num_warps=8,
        )  # fmt: skip
        assert gluon_topk.select(
            logits, rows, thresh, counts, cand, out, L, k, cap, idx_bits, block, k_block
        )
        record["select"] = (want, out.clone(), counts[:, 0].clone())
        return True

    return TopkKernels(threshold, select, compact)


def _check(logits, starts, ends, k, valid_windows=True):
    """The Gluon kernels' outputs equal the Triton kernels' (T, the live list and its count,
    zeroed counts; the selection in the same order) and, for windows inside the rows, the
    top-k is the reference's set. Returns the rows that searched T and their candidates."""
    record = {}
    got = topk_threshold.topk(logits, starts, ends, k, kernels=_both(record))
    if valid_windows:
        assert sets_equal(got, reference(logits, starts, ends, k))
    (start, end), want, mine = record["threshold"]
    searched = (end.clamp(0, logits.shape[1]) - start.clamp(0, logits.shape[1])) > k
    thresh, _, live, nlive = want
    my_thresh, my_counts, my_live, my_nlive = mine
    assert not my_counts[:, 0].any(), "candidate counts not zeroed"
    assert torch.equal(my_thresh[searched], thresh[searched]), "T differs"
    assert torch.equal(my_nlive[searched], nlive[searched]), "live-segment counts differ"
    for r in torch.nonzero(searched).flatten().tolist():
        n = int(nlive[r])
        assert torch.equal(my_live[r, :n], live[r, :n]), f"row {r}: live segments differ"
    want_counts, want_cand, my_counts, my_cand, cap = record["compact"]
    assert torch.equal(my_counts, want_counts), "candidate counts differ"
    for r in torch.nonzero(searched & (want_counts <= cap)).flatten().tolist():
        n = int(want_counts[r])  # the same (key, column) pairs, in any order (atomics')
        pairs = [
            sorted(zip(c[0, r, :n].tolist(), c[1, r, :n].tolist(), strict=True))
            for c in (want_cand, my_cand)
        ]
        assert pairs[0] == pairs[1], f"row {r}: candidates differ"
    want_out, my_out, counts = record["select"]
    assert torch.equal(my_out, want_out), "selections differ"
    assert torch.equal(got, my_out)
    return searched, counts


@pytest.mark.parametrize("rows,length", [(64, 131072), (1, 131072), (64, 32782), (8, 32768)])
def test_indexer_like_rows(rows, length):
    torch.manual_seed(rows + length)
    logits = indexer_like_logits(rows, length)
    starts = torch.zeros(rows, dtype=I32, device="cuda")
    ends = torch.full((rows,), length, dtype=I32, device="cuda")
    assert _check(logits, starts, ends, 2048)[0].all()


def test_ties_nan_infinities_and_short_windows():
    torch.manual_seed(0)
    length = 40000
    logits = torch.randn(8, length, device="cuda")
    logits[0] = 0.5  # all equal: lo == hi, no round searched
    logits[1, ::3] = float("nan")  # NaN counts as -inf
    logits[2] = float("-inf")
    logits[2, 17] = 1.0
    logits[3] = torch.round(logits[3] * 2)  # few distinct values: ties at T
    logits[4, ::5] = float("inf")
    logits[5] = torch.arange(length, dtype=torch.float32, device="cuda")  # sorted
    logits[6, :4800] = 1.0 + torch.rand(4800, device="cuda")  # 300 whole segments above
    logits[6, 4800:] *= 0.01  # the rest: T among the low maxima, ~6,600 candidates
    starts = torch.tensor([0, 10, 0, 0, 5, 600, 0, 30000], dtype=I32, device="cuda")
    ends = torch.tensor([40000, 39990, 40000, 40000, 1200, 40000, 40000, 31000], dtype=I32)
    searched, counts = _check(logits, starts, ends.cuda(), 2048)
    assert searched.tolist() == [True, True, True, True, False, True, True, False]
    assert counts[0] > 8192, "the all-equal row takes the slow path"
    assert 4096 < counts[6] <= 8192, f"a full tile: {int(counts[6])} candidates"


def test_clamped_windows():
    """Windows past the row's ends are clamped by the kernels (the reference refuses them):
    the Gluon kernels must clamp as the Triton ones do."""
    torch.manual_seed(3)
    logits = torch.randn(4, 20000, device="cuda")
    starts = torch.tensor([-7, 0, 19000, 5], dtype=I32, device="cuda")
    ends = torch.tensor([15000, 50000, 18000, -3], dtype=I32, device="cuda")
    searched, _ = _check(logits, starts, ends, 2048, valid_windows=False)
    assert searched.tolist() == [True, True, False, False]


def test_tails_past_m():
    """M = 8192 maxima vote (k = 2048), SLACK = 128 segments past them are compacted only:
    windows of 4M + 1 to 4(M + SLACK) columns keep 4-column segments, and the best scores in
    the tail must come through the list's tail part."""
    torch.manual_seed(1)
    M = 8192
    windows = [
        (0, 4 * M),  # M segments
        (0, 4 * M + 1),  # a tail of one column
        (0, 4 * (M + 128)),  # M + SLACK, the top k in the tail
        (0, 4 * (M + 128) + 1),  # 8-column segments
        (3, 4 * (M + 128) + 2),  # unaligned
        (0, 32782),  # the engine's rows
    ]
    logits = torch.randn(len(windows), 4 * (M + 128) + 64, device="cuda")
    logits[2, 4 * M : 4 * (M + 128)] += 10.0  # 512 tail columns above every head column
    logits[5, 32768:32782] += 10.0
    starts, ends = torch.tensor(windows, dtype=I32, device="cuda").T.contiguous()
    assert _check(logits, starts, ends, 2048)[0].all()


def test_in_a_cuda_graph():
    torch.manual_seed(2)
    logits = indexer_like_logits(4, 32782)
    starts = torch.zeros(4, dtype=I32, device="cuda")
    ends = torch.full((4,), 32782, dtype=I32, device="cuda")
    gluon_topk = _kernel()
    kernels = TopkKernels(gluon_topk.threshold, gluon_topk.select, gluon_topk.compact)
    out = topk_threshold.topk(logits, starts, ends, 2048, kernels=kernels)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk_threshold.topk(logits, starts, ends, 2048, kernels=kernels)
    logits.copy_(indexer_like_logits(4, 32782))
    graph.replay()
    assert sets_equal(out, reference(logits, starts, ends, 2048))
