"""The Triton kernels on a CUDA GPU, at the models' shapes (the vendor adapters' GPU tests are
beside their plugin, in plugins/nvidia/tests/test_adapters_gpu.py).

Skipped on machines without a CUDA device (CI); run on the H200 with
``PYTHONPATH=core:plugins/nvidia pytest tests/kernels/test_gpu_kernels.py``.
"""

from __future__ import annotations

import pytest
import torch

from hwrun import knobs
from hwrun.formats.index_keys import get_index_key_format
from hwrun.ops import indexer as ref_indexer
from hwrun.ops import sparse_mla as ref_mla
from hwrun.ops.topk import topk as ref_topk
from tests.kernels.gpu_inputs import (
    check_mla,
    indexer_like_logits,
    mla_inputs,
    paged_inputs,
    relative_error,
    sets_equal,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or knobs.triton_interpret(),
    reason="needs a CUDA GPU and compiled Triton (the interpreter tests cover CPU)",
)


@pytest.mark.parametrize("rows,length", [(64, 131072), (1, 131072), (8, 32768), (8, 3000)])
def test_topk_sets(rows, length):
    from hwrun.kernels.triton.topk_threshold import topk

    logits = torch.randn(rows, length, device="cuda").relu_()  # half exact zeros: ties
    logits[0, :100] = float("nan")
    starts = torch.randint(0, 64, (rows,), device="cuda", dtype=torch.int32)
    ends = torch.full((rows,), length, device="cuda", dtype=torch.int32)
    ends[-1] = starts[-1] + 1000 if rows > 1 else length  # a row shorter than k
    assert sets_equal(topk(logits, starts, ends, 2048), ref_topk(logits, starts, ends, 2048))


def _decode_like_topk_rows():
    """64 x 131072 indexer-like rows, decode windows of many lengths, and two rows whose
    candidates overflow the buffer: sorted scores (every segment maximum is its last column)
    and all-equal scores."""
    logits = indexer_like_logits(64, 131072)
    logits[1] = torch.arange(131072, device="cuda", dtype=torch.float32)
    logits[2] = 0.25
    starts = torch.zeros(64, device="cuda", dtype=torch.int32)
    ends = torch.randint(2049, 131073, (64,), device="cuda", dtype=torch.int32)
    ends[:4] = 131072
    ends[4] = 1500  # shorter than k
    ends[5] = 2048  # exactly k
    starts[6], ends[6] = 70000, 90000  # a window inside the row
    return logits, starts, ends


def test_topk_indexer_like_rows_stay_on_the_fast_path():
    from hwrun.kernels.triton.topk_threshold import ThresholdTiles, candidate_counts, topk

    logits, starts, ends = _decode_like_topk_rows()
    counts = candidate_counts(logits, starts, ends, 2048)
    capacity = ThresholdTiles().capacity
    assert (counts[1:3] > capacity).all(), counts[:8]  # the slow path
    fast = counts[[0, 3, *range(6, 64)]]
    assert (fast >= 2048).all() and (fast <= capacity).all(), fast
    assert sets_equal(topk(logits, starts, ends, 2048), ref_topk(logits, starts, ends, 2048))


def test_topk_prefill_shape():
    from hwrun.kernels.triton.topk_threshold import topk

    rows, length = 4096, 16384
    logits = torch.randn(rows, length, device="cuda")
    starts = torch.zeros(rows, device="cuda", dtype=torch.int32)
    ends = torch.arange(length - rows + 1, length + 1, device="cuda", dtype=torch.int32)
    assert sets_equal(topk(logits, starts, ends, 2048), ref_topk(logits, starts, ends, 2048))


def test_topk_sweep_grid_compiles_and_selects_exactly():
    """Every configuration bench/topk_gpu.py --sweep times, on rows with ties and an
    overflowing row."""
    from hwrun.kernels.triton.topk_threshold import SWEEP_GRID, topk

    logits = indexer_like_logits(8, 32768)
    logits[1] = torch.round(logits[1] * 4)
    logits[2] = torch.arange(32768, device="cuda", dtype=torch.float32)
    starts = torch.zeros(8, device="cuda", dtype=torch.int32)
    ends = torch.full((8,), 32768, device="cuda", dtype=torch.int32)
    ends[3] = 5000
    want = ref_topk(logits, starts, ends, 2048)
    for tiles in SWEEP_GRID:
        assert sets_equal(topk(logits, starts, ends, 2048, tiles), want), tiles


def test_topk_large_k_takes_the_radix_kernel():
    from hwrun.kernels.triton.topk_threshold import topk

    logits = torch.randn(8, 65536, device="cuda").relu_()
    starts = torch.zeros(8, device="cuda", dtype=torch.int32)
    ends = torch.full((8,), 65536, device="cuda", dtype=torch.int32)
    assert sets_equal(topk(logits, starts, ends, 8192), ref_topk(logits, starts, ends, 8192))


def test_topk_replays_in_a_cuda_graph():
    """No host synchronisation: the call captures, and a replay on new scores (an overflowing
    row included) selects what the reference does."""
    from hwrun.kernels.triton.topk_threshold import topk

    logits, starts, ends = _decode_like_topk_rows()
    topk(logits, starts, ends, 2048)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk(logits, starts, ends, 2048)
    logits.copy_(torch.randn_like(logits))
    logits[7] = -1.0
    ends.copy_(torch.randint(1, 131073, (64,), device="cuda", dtype=torch.int32))
    starts.copy_(torch.minimum(starts, ends))
    graph.replay()
    assert sets_equal(out, ref_topk(logits, starts, ends, 2048))


def test_topk_folded_threshold_sees_every_programs_maxima():
    """fold_threshold: each row's last _segment_max program reads maxima the row's other
    programs stored (ordered by the arrival count's acquire-release): the candidate counts,
    hence T, equal the _threshold launch's on every row, call after call (the engine's 64 x
    32782 decode rows, and 64 x 131072), eagerly and in graph replays on new scores."""
    from dataclasses import replace

    from hwrun.kernels.triton.topk_threshold import ThresholdTiles, candidate_counts, topk

    folded = replace(ThresholdTiles(), fold_threshold=True)
    for length in (32782, 131072):
        logits = indexer_like_logits(64, length)
        starts = torch.zeros(64, device="cuda", dtype=torch.int32)
        ends = torch.full((64,), length, device="cuda", dtype=torch.int32)
        ends[:8] = torch.randint(2049, length, (8,), device="cuda", dtype=torch.int32)
        want = candidate_counts(logits, starts, ends, 2048)
        for _ in range(20):
            assert torch.equal(candidate_counts(logits, starts, ends, 2048, folded), want)
        topk(logits, starts, ends, 2048, folded)  # compiled outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = topk(logits, starts, ends, 2048, folded)
        for replay in range(3):
            logits.copy_(indexer_like_logits(64, length))
            graph.replay()
            assert sets_equal(out, ref_topk(logits, starts, ends, 2048)), (length, replay)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.bfloat16])
@pytest.mark.parametrize("batch,next_n,heads", [(8, 1, 64), (4, 2, 32), (1, 1, 64), (3, 1, 10)])
def test_logits_paged(fmt, q_dtype, batch, next_n, heads):
    from hwrun.kernels.triton.indexer_logits import logits_paged

    ctx = 8192
    q, w, cache, table, lens = paged_inputs(fmt, batch, ctx, heads, next_n, q_dtype)
    got = logits_paged(q, w, cache, fmt, table, lens, ctx + 100)
    want = ref_indexer.logits_paged(q, w, cache, fmt, table, lens, ctx + 100)
    assert relative_error(got, want) < 2e-3


# The defaults (spans of up to 32 tiles) and bench/gpu_ops.py --tune's forms: a tile a program,
# spans of 8 and 64 tiles, 8 warps, 128-key tiles, 2 rows at 4 stages, mxfp4's 4 rows at 8 warps
# and 2 stages.
RAGGED_FORMS = [
    {},
    {"tiles": 1},
    {"tiles": 64},
    {"tiles": 32, "rows": 2, "num_stages": 4},
    {"tiles": 8},
    {"tiles": 8, "num_warps": 8},
    {"tiles": 3, "num_warps": 8, "block_n": 128},
    {"tiles": 8, "rows": 1},
    {"tiles": 8, "rows": 4, "num_warps": 8, "num_stages": 2},
]


@pytest.mark.parametrize("form", RAGGED_FORMS, ids=str)
@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_logits_ragged(fmt, form):
    from hwrun.kernels.triton.indexer_logits_ragged import logits_ragged

    m, n, heads = 300, 2000, 64
    elements, scales = get_index_key_format(fmt).encode(torch.randn(n, 128, device="cuda"))
    q = torch.randn(m, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(m, heads, device="cuda")
    ks = torch.randint(0, 500, (m,), device="cuda", dtype=torch.int32)
    ke = torch.maximum(ks, torch.randint(0, n + 1, (m,), device="cuda", dtype=torch.int32))
    got = logits_ragged(q, w, elements, scales, fmt, ks, ke, **form)
    want = ref_indexer.logits_ragged(q, w, elements, scales, fmt, ks, ke)
    assert relative_error(got, want) < 2e-3


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("batch,s,heads", [(4, 1, 128), (1, 1, 128), (2, 2, 64), (2, 1, 20)])
def test_sparse_mla_decode(fmt, batch, s, heads):
    from hwrun.kernels.triton.sparse_mla import decode

    q, cache, slots, lengths, sink = mla_inputs(fmt, batch, s, heads, 2048)
    got = decode(q, cache, fmt, slots, 0.07, lengths, sink)
    check_mla(got, ref_mla.decode(q, cache, fmt, slots, 0.07, lengths, sink))


def test_kv_writes_byte_exact_at_scale():
    # The reference bytes are computed on CPU: the formats define IEEE division, and on CUDA
    # torch divides by a Python scalar through its reciprocal (amax / 448 then differs in the
    # last bit of some fp8_ds_mla scales).
    from hwrun.kernels.triton.kv_write import write_index_keys, write_latent
    from hwrun.ops import kv_write as ref

    tokens = 4096
    slots = torch.randperm(2 * tokens, device="cuda")[:tokens].to(torch.int32)
    slots[::17] = -1
    keys = torch.randn(tokens, 128, device="cuda", dtype=torch.bfloat16)
    for fmt, bpt in (("fp8", 132), ("mxfp4", 68)):
        a = torch.zeros(2 * tokens // 64, 64 * bpt, dtype=torch.uint8, device="cuda")
        b = a.cpu()
        write_index_keys(a, keys, slots, fmt)
        ref.write_index_keys(b, keys.cpu(), slots.cpu(), fmt)
        assert torch.equal(a.cpu(), b), fmt
    nope = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    rope = torch.randn(tokens, 64, device="cuda", dtype=torch.bfloat16)
    for fmt, row_bytes in (("fp8_ds_mla", 656), ("bf16", 1152)):
        a = torch.zeros(2 * tokens // 64, 64, row_bytes, dtype=torch.uint8, device="cuda")
        b = a.cpu()
        write_latent(a, nope, rope, slots, fmt)
        ref.write_latent(b, nope.cpu(), rope.cpu(), slots.cpu(), fmt)
        diff = (a.cpu() != b).nonzero()
        assert diff.numel() == 0, f"{fmt}: {len(diff)} bytes differ, row offsets {diff[:8, 2]}"


def test_lse_combine_at_scale():
    from hwrun.kernels.triton.lse_combine import lse_combine
    from hwrun.ops.attn import lse_combine as ref

    outs = torch.randn(4, 64, 128, 512, device="cuda", dtype=torch.bfloat16)
    lses = torch.randn(4, 64, 128, device="cuda")
    lses[2, :3] = float("-inf")
    lses[:, 5] = float("-inf")
    got, want = lse_combine(outs, lses), ref(outs, lses)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.parametrize("kv_dtype,heads", [(torch.bfloat16, 128), (torch.float32, 20)])
def test_sparse_mla_prefill(kv_dtype, heads):
    from hwrun.kernels.triton.sparse_mla import prefill

    tokens, workspace, k = 64, 4096, 2048
    q = torch.randn(tokens, heads, 576, device="cuda", dtype=torch.bfloat16)
    # fp32 workspaces hold bf16 values, as the engine's (decoded from the cache formats).
    kv = torch.randn(workspace, 576, device="cuda").to(torch.bfloat16).to(kv_dtype)
    indices = torch.randint(0, workspace, (tokens, k), device="cuda", dtype=torch.int32)
    indices[3, :] = -1  # an empty row
    indices[5, 100:] = -1
    lengths = torch.full((tokens,), k, device="cuda", dtype=torch.int32)
    lengths[7] = 33  # a row shorter than k
    sink = torch.randn(heads, device="cuda")
    got = prefill(q, kv, indices, 0.07, lengths, sink)
    check_mla(got, ref_mla.prefill(q, kv, indices, 0.07, lengths, sink))


def _fp8_experts(experts, rows, cols, name):
    """A random fp8_block128 weight built from codes (quantizing 30 GB of fp32 takes too long):
    e4m3 codes of magnitude up to 1.875 with random signs, scales around 0.02."""
    from hwrun.ops.quantized_weight import QuantizedWeight

    lead = (experts,) if experts else ()
    codes = torch.randint(0, 0x40, (*lead, rows, cols), device="cuda", dtype=torch.uint8)
    codes |= torch.randint(0, 2, codes.shape, device="cuda", dtype=torch.uint8) << 7
    tiles = (*lead, -(-rows // 128), -(-cols // 128))
    scales = torch.rand(tiles, device="cuda") * 0.02 + 0.01
    return QuantizedWeight("fp8_block128", (*lead, rows, cols), codes, scales, name=name)


def _moe_close(got, want):
    scale = float(want.float().abs().amax())
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-3 * scale)


@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_moe_experts_deepseek_v3_shapes(tokens):
    """256 experts, top 8, hidden 7168, expert width 2048, one shared expert, fp8 block-128."""
    from hwrun.kernels.triton.moe import experts
    from hwrun.ops.moe_experts import experts as reference

    num_experts, hidden, inter, k = 256, 7168, 2048, 8
    w13 = _fp8_experts(num_experts, 2 * inter, hidden, "w13")
    w2 = _fp8_experts(num_experts, hidden, inter, "w2")
    shared = (_fp8_experts(0, 2 * inter, hidden, "sw13"), _fp8_experts(0, hidden, inter, "sw2"))
    x = (torch.randn(tokens, hidden, device="cuda") * 0.1).to(torch.bfloat16)
    ids = torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k].to(torch.int32)
    ids[0, 2] = -1  # a slot served by another rank
    if tokens > 1:
        ids[1, :] = -1  # a token with only the shared expert
    weights = torch.rand(tokens, k, device="cuda")
    got = experts(x, w13, w2, ids, weights, "bf16", shared)
    _moe_close(got, reference(x, w13, w2, ids, weights, "bf16", shared))


@pytest.mark.parametrize("tokens", [1, 64])
@pytest.mark.parametrize(
    "block_n,f16,splits,tma,host",
    [(32, False, 1, False, False), (32, True, 1, False, False), (64, True, 1, False, False),
     (128, True, 1, False, False), (64, True, 2, False, False), (64, True, 4, False, False),
     (32, False, 3, False, False), (128, True, 4, True, False), (128, True, 1, True, False),
     (64, True, 3, True, False), (32, False, 1, True, False), (128, True, 4, True, True),
     (128, True, 1, True, True), (64, True, 3, True, True)],
)  # fmt: skip
def test_moe_experts_decode_tile_variants_bench_model_shapes(
    tokens, block_n, f16, splits, tma, host
):
    """bf16 and f16 products at the bench model's experts: 64 experts, top 8, hidden 4096,
    width 512, one shared expert as group E; e4m3 codes through pointers or descriptors (each
    program's, or with ``host`` one built on the host over the groups stacked)."""
    from hwrun.kernels.triton.moe import TileConfig, experts, stack_shared_group
    from hwrun.ops.moe_experts import experts as reference

    num_experts, hidden, inter, k = 64, 4096, 512, 8
    w13 = _fp8_experts(num_experts, 2 * inter, hidden, "w13")
    w2 = _fp8_experts(num_experts, hidden, inter, "w2")
    shared = (_fp8_experts(0, 2 * inter, hidden, "sw13"), _fp8_experts(0, hidden, inter, "sw2"))
    if host:
        w13, sw13 = stack_shared_group(w13, shared[0])
        w2, sw2 = stack_shared_group(w2, shared[1])
        shared = (sw13, sw2)
    x = (torch.randn(tokens, hidden, device="cuda") * 0.1).to(torch.bfloat16)
    x[0, :7] *= 1e6  # one token's row far from the rest: its f16 scale is its own
    ids = torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k].to(torch.int32)
    ids[0, 2] = -1
    weights = torch.rand(tokens, k, device="cuda")
    tiles = TileConfig(
        16, block_n, 128, 4, 4, f16_products=f16, gate_up_splits=splits, tma=tma,
        host_descriptors=host,
    )  # fmt: skip
    got = experts(x, w13, w2, ids, weights, "bf16", shared, tiles=tiles)
    _moe_close(got, reference(x, w13, w2, ids, weights, "bf16", shared))
    # split K: the last split adds every split's sums in split order, whichever finished last
    again = experts(x, w13, w2, ids, weights, "bf16", shared, tiles=tiles)
    assert torch.equal(got, again)


def _a8w8_close(got, want, bf16):
    """a8w8 against its reference, with the tolerance the e4m3 intermediate needs. The products
    are summed in another order, and within each 128-wide K step in the matrix units' reduced
    fp8 accumulation (Triton's default on sm_90, DeepGEMM's promotion interval), so some gate/up
    sums land on the other side of an e4m3 rounding of silu(gate) * up: each such flip moves
    every output of its row by one e4m3 step (1/8) of one of I terms. On the H200 (2026-12-04)
    that left 2-9% of the outputs past _moe_close's tolerance, at most 0.9% of the output's
    scale, where the bf16 activations' result sits 3-5% away. So: within 2^-5 of the scale,
    and at least four times nearer to the a8w8 reference than to the bf16 one (the activations
    are quantized)."""
    scale = float(want.float().abs().amax())
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2**-5 * scale)
    error = (got.float() - want.float()).norm()
    assert error * 4 < (got.float() - bf16.float()).norm()


@pytest.mark.parametrize(
    "shape,tokens,splits,stages",
    [("v3", 1, 1, 3), ("v3", 64, 1, 4), ("v3", 300, 1, 3), ("bench", 1, 4, 3),
     ("bench", 16, 1, 3), ("bench", 64, 4, 4), ("bench", 64, 1, 3)],
)  # fmt: skip
def test_moe_experts_a8w8_at_model_shapes(shape, tokens, splits, stages):
    """a8w8 (e4m3 activations, wgmma e4m3 x e4m3) at DeepSeek-V3's experts (256 x 7168 x 2048)
    and the bench model's (64 x 4096 x 512), one shared expert as group E through the host
    descriptors, against the reference's a8w8; the default tiles, then forced splits and
    stages at 16 x 128. Split runs repeat bit for bit."""
    from dataclasses import replace

    from hwrun.kernels.triton.moe import DECODE_TILES, a8w8_tiles, experts, stack_shared_group
    from hwrun.ops.moe_experts import experts as reference

    num_experts, hidden, inter = (256, 7168, 2048) if shape == "v3" else (64, 4096, 512)
    k = 8
    w13, sw13 = stack_shared_group(
        _fp8_experts(num_experts, 2 * inter, hidden, "w13"), _fp8_experts(0, 2 * inter, hidden, "s")
    )
    w2, sw2 = stack_shared_group(
        _fp8_experts(num_experts, hidden, inter, "w2"), _fp8_experts(0, hidden, inter, "sw2")
    )
    shared = (sw13, sw2)
    x = (torch.randn(tokens, hidden, device="cuda") * 0.1).to(torch.bfloat16)
    x[0, :7] *= 1e3  # one token's groups far from the rest: their scales are their own
    ids = torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k].to(torch.int32)
    ids[0, 2] = -1
    weights = torch.rand(tokens, k, device="cuda")
    want = reference(x, w13, w2, ids, weights, "a8w8", shared)
    got = experts(x, w13, w2, ids, weights, "a8w8", shared)
    _a8w8_close(got, want, reference(x, w13, w2, ids, weights, "bf16", shared))
    tiles = replace(
        a8w8_tiles(DECODE_TILES), gate_up_splits=splits, num_stages=stages, tma=True,
        host_descriptors=True,
    )  # fmt: skip
    forced = experts(x, w13, w2, ids, weights, "a8w8", shared, tiles=tiles)
    _a8w8_close(forced, want, reference(x, w13, w2, ids, weights, "bf16", shared))
    assert torch.equal(forced, experts(x, w13, w2, ids, weights, "a8w8", shared, tiles=tiles))


def _int4_experts(experts, rows, cols, name):
    """A random int4_g128 weight (W4A16) built from codes: every nibble, scales around 0.02."""
    from hwrun.ops.quantized_weight import QuantizedWeight

    lead = (experts,) if experts else ()
    packed = torch.randint(0, 256, (*lead, rows, cols // 2), device="cuda", dtype=torch.uint8)
    scales = torch.rand((*lead, rows, cols // 128), device="cuda") * 0.02 + 0.01
    return QuantizedWeight("int4_g128", (*lead, rows, cols), packed, scales, name=name)


@pytest.mark.parametrize("tokens", [1, 64])
def test_moe_experts_w4a16_deepseek_v3_shapes(tokens):
    """The W4A16 path (the PPU's MoE) at DeepSeek-V3 shapes, a shared expert as group E."""
    from hwrun.kernels.triton.moe import experts
    from hwrun.ops.moe_experts import experts as reference

    num_experts, hidden, inter, k = 256, 7168, 2048, 8
    w13 = _int4_experts(num_experts, 2 * inter, hidden, "w13")
    w2 = _int4_experts(num_experts, hidden, inter, "w2")
    shared = (_int4_experts(0, 2 * inter, hidden, "sw13"), _int4_experts(0, hidden, inter, "sw2"))
    x = (torch.randn(tokens, hidden, device="cuda") * 0.1).to(torch.bfloat16)
    ids = torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k].to(torch.int32)
    ids[0, 2] = -1  # a slot served by another rank
    weights = torch.rand(tokens, k, device="cuda")
    got = experts(x, w13, w2, ids, weights, "bf16", shared)
    _moe_close(got, reference(x, w13, w2, ids, weights, "bf16", shared))


def test_moe_experts_bf16_weights_and_own_shared_launches():
    from hwrun.kernels.triton.moe import experts
    from hwrun.ops.moe_experts import experts as reference
    from hwrun.ops.quantized_weight import quantize_weight

    num_experts, hidden, inter, k, tokens = 8, 7168, 2048, 2, 200
    w13 = quantize_weight(torch.randn(num_experts, 2 * inter, hidden, device="cuda") * 0.02, "bf16")
    w2 = quantize_weight(torch.randn(num_experts, hidden, inter, device="cuda") * 0.02, "bf16")
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k].to(torch.int32)
    ids[:, 1][ids[:, 1] == 3] = -1  # expert 3 served in slot 0 only
    weights = torch.rand(tokens, k, device="cuda")
    # Narrower shared experts than the routed: their own launches, not group E.
    shared = tuple(
        quantize_weight(torch.randn(shape, device="cuda") * 0.02, "bf16")
        for shape in ((2 * 1024, hidden), (hidden, 1024))
    )
    got = experts(x, w13, w2, ids, weights, "bf16", shared)
    _moe_close(got, reference(x, w13, w2, ids, weights, "bf16", shared))


def test_moe_experts_replays_in_a_cuda_graph():
    """No host synchronisation: the call captures, and a replay with new routing is right."""
    from hwrun.kernels.triton.moe import experts

    num_experts, hidden, inter, k, tokens = 64, 1024, 512, 8, 8
    w13 = _fp8_experts(num_experts, 2 * inter, hidden, "w13")
    w2 = _fp8_experts(num_experts, hidden, inter, "w2")
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k].to(torch.int32)
    weights = torch.rand(tokens, k, device="cuda")
    experts(x, w13, w2, ids, weights)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = experts(x, w13, w2, ids, weights)
    ids.copy_(torch.rand(tokens, num_experts, device="cuda").argsort(1)[:, :k])
    ids[2, :3] = -1
    x.copy_(torch.randn(tokens, hidden, device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, experts(x, w13, w2, ids, weights), rtol=0, atol=0)


# dense.linear at the bench model's projections (hidden 4096, 64 heads, q-LoRA 1536): q_a,
# q_b, kv_a, o_proj, the indexer's wq_b and wk ([R, C]), block-FP8 as the checkpoint stores them.
LINEAR_SHAPES = {
    "q_a": (1536, 4096),
    "q_b": (12288, 1536),
    "kv_a": (576, 4096),
    "o_proj": (4096, 8192),
    "wq_b": (8192, 1536),
    "wk": (128, 4096),
}


def _fp8_linear_weight(rows: int, cols: int, fmt: str = "fp8_block128"):
    weight = _fp8_experts(0, rows, cols, "w")
    if fmt == "fp8_block128_ue8m0":
        from hwrun.ops.quantized_weight import QuantizedWeight

        codes = torch.randint(118, 125, weight.scales.shape, device="cuda", dtype=torch.uint8)
        weight = QuantizedWeight(fmt, weight.shape, weight.data, codes, name="w")
    return weight


@pytest.mark.parametrize("tokens", [1, 8, 64, 512])
@pytest.mark.parametrize("name", sorted(LINEAR_SHAPES))
def test_dense_linear_bench_model_shapes(name, tokens):
    """Every default tile regime (decode split-K at 1-64 rows, prefill at 512) at real shapes."""
    from hwrun.kernels.triton.linear import linear
    from hwrun.ops.linear import linear as reference

    weight = _fp8_linear_weight(*LINEAR_SHAPES[name])
    x = (torch.randn(tokens, weight.shape[1], device="cuda") * 0.1).to(torch.bfloat16)
    _moe_close(linear(x, weight), reference(x, weight))


@pytest.mark.parametrize("fmt", ["fp8_block128_ue8m0", "bf16"])
def test_dense_linear_other_formats(fmt):
    """ue8m0 scales, and a bf16 weight (an LM head's width, 32768 rows of 4096)."""
    from hwrun.kernels.triton.linear import linear
    from hwrun.ops.linear import linear as reference
    from hwrun.ops.quantized_weight import quantize_weight

    if fmt == "bf16":
        weight = quantize_weight(torch.randn(32768, 4096, device="cuda") * 0.02, "bf16")
    else:
        weight = _fp8_linear_weight(4096, 8192, fmt)
    for tokens in (1, 300):
        x = (torch.randn(tokens, weight.shape[1], device="cuda") * 0.1).to(torch.bfloat16)
        _moe_close(linear(x, weight), reference(x, weight))


@pytest.mark.parametrize("regime", ["decode", "prefill"])
def test_dense_linear_tile_grid_compiles_for_this_gpu(regime):
    """Every configuration bench/linear_gpu.py --tune sweeps compiles and computes the op
    (decode shapes with their K split in four)."""
    from dataclasses import replace

    from hwrun.kernels.triton.linear import DECODE_GRID, PREFILL_GRID, linear
    from hwrun.ops.linear import linear as reference

    weight = _fp8_linear_weight(1536, 4096)
    tokens, grid = (64, DECODE_GRID) if regime == "decode" else (300, PREFILL_GRID)
    x = (torch.randn(tokens, 4096, device="cuda") * 0.1).to(torch.bfloat16)
    want = reference(x, weight)
    for tiles in grid:
        if tiles.tma:  # dense.linear_a8w8 only: the test below
            continue
        tiles = replace(tiles, split_k=4) if regime == "decode" else tiles
        _moe_close(linear(x, weight, tiles), want)


def test_dense_linear_replays_in_a_cuda_graph():
    """No host synchronisation: split-K decode captures, and a replay with new rows is right."""
    from hwrun.kernels.triton.linear import default_tiles, linear

    weight = _fp8_linear_weight(576, 4096)
    assert default_tiles(8, 576, 4096, 132).split_k > 1  # the two-launch path is captured
    _assert_replay_matches_eager(linear, weight)


def _assert_replay_matches_eager(fn, weight) -> None:
    """``fn(x, weight)`` for 8 rows captured in a CUDA graph, replayed on new rows: exactly an
    eager call's result."""
    x = torch.randn(8, weight.shape[1], device="cuda", dtype=torch.bfloat16)
    fn(x, weight)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x, weight)
    x.copy_(torch.randn(8, weight.shape[1], device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, fn(x, weight), rtol=0, atol=0)


# dense.linear_a8w8: activations quantized per token and 128 columns, e4m3 on both sides.
A8W8_SHAPES = {**LINEAR_SHAPES, "q_a+wk+kv_a": (2240, 4096), "q_b+wq_b": (20480, 1536)}


@pytest.mark.parametrize("tokens", [1, 64, 512])
@pytest.mark.parametrize("name", sorted(A8W8_SHAPES))
def test_dense_linear_a8w8_bench_model_shapes(name, tokens):
    """Byte-exact activation codes, then the GEMM within the dense.linear tolerance, at the bench
    model's projections and the engine's joined ones; a row with an outlier and a zero group."""
    from hwrun.formats.fp8 import quantize_fp8_groups
    from hwrun.kernels.triton.activation_quant import quantize_activations
    from hwrun.kernels.triton.linear import linear_a8w8
    from hwrun.ops.linear import linear_a8w8 as reference

    weight = _fp8_linear_weight(*A8W8_SHAPES[name])
    x = (torch.randn(tokens, weight.shape[1], device="cuda") * 0.1).to(torch.bfloat16)
    x[0, 3] = 300.0
    x[-1, 128:256] = 0
    codes, scales = quantize_activations(x, ue8m0=False)
    want_codes, want_scales = quantize_fp8_groups(x.float(), 128)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    _moe_close(linear_a8w8(x, weight), reference(x, weight))


def test_dense_linear_a8w8_ue8m0_tiles_and_graph_replay():
    """ue8m0 on both sides; every decode and prefill tile of the sweep grids with 128-wide K
    steps; a split-K decode captured in a CUDA graph and replayed on new rows."""
    from dataclasses import replace

    from hwrun.kernels.triton.linear import DECODE_GRID, PREFILL_GRID, LinearTiles, linear_a8w8
    from hwrun.ops.linear import linear_a8w8 as reference

    weight = _fp8_linear_weight(4096, 8192, "fp8_block128_ue8m0")
    for tokens, grid in ((64, DECODE_GRID), (300, PREFILL_GRID)):
        x = (torch.randn(tokens, 8192, device="cuda") * 0.1).to(torch.bfloat16)
        want = reference(x, weight)
        _moe_close(linear_a8w8(x, weight), want)
        for tiles in grid:
            tiles = replace(tiles, block_k=128, split_k=4 if tokens == 64 else 1)
            _moe_close(linear_a8w8(x, weight, tiles), want)
    _assert_replay_matches_eager(linear_a8w8, weight)
    # tensor descriptors take launch scratch from torch's allocator: under capture too
    tma = LinearTiles(64, 64, 128, split_k=4, num_stages=4, tma=True)
    _assert_replay_matches_eager(lambda x, w: linear_a8w8(x, w, tma), weight)


# moe.route and indexer.to_slots: one launch each (the torch tier's took ~45 and ~6).


def _router_logits(tokens: int, ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3.2's router: [T, 256] fp32 logits and an fp32 correction bias; with ``ties``
    rounded to few distinct values, so equal choices decide ids at every rank."""
    logits = torch.randn(tokens, 256, device="cuda") * 2
    bias = torch.rand(256, device="cuda") * 0.1
    if ties:
        logits, bias = torch.round(logits * 2) / 2, torch.round(bias * 20) / 20
    return logits, bias


_DEEPSEEK_ROUTE = {
    "scoring": "sigmoid",
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
}


@pytest.mark.parametrize("tokens", [1, 64, 4096])
@pytest.mark.parametrize("ties", [False, True])
def test_moe_route_deepseek_shape(tokens, ties):
    """Ids exactly the reference's, in its order; weights within the conformance tolerance."""
    from hwrun.kernels.triton.moe_route import route
    from hwrun.ops.moe_route import route as reference

    logits, bias = _router_logits(tokens, ties)
    weights, ids = route(logits, 8, e_score_correction_bias=bias, **_DEEPSEEK_ROUTE)
    want_weights, want_ids = reference(logits, 8, e_score_correction_bias=bias, **_DEEPSEEK_ROUTE)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("experts", "top_k", "options"),
    [
        (160, 6, {"scoring": "softmax", "n_group": 8, "topk_group": 3}),  # groups of 20
        (384, 8, {"scoring": "sigmoid"}),  # Kimi-K2-sized, ungrouped
        (60, 4, {"scoring": "softmax", "renormalize": False}),
        (1024, 10, {"scoring": "sigmoid", "n_group": 1, "topk_group": 1}),  # four warps
    ],
)
def test_moe_route_other_routers(experts, top_k, options):
    from hwrun.kernels.triton.moe_route import route
    from hwrun.ops.moe_route import route as reference

    logits = (torch.randn(64, experts, device="cuda") * 2).to(torch.bfloat16)
    weights, ids = route(logits, top_k, **options)
    want_weights, want_ids = reference(logits, top_k, **options)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows,next_n", [(64, 1), (32, 2)])
def test_to_slots_decode_shape(rows, next_n):
    """64 rows x 2048 positions over 2048-block tables of 64 tokens; -1 padding and rows
    shorter than k; unallocated entries past each request's length."""
    from hwrun.kernels.triton.to_slots import to_slots
    from hwrun.ops.topk import to_slots as reference

    requests, max_blocks, block_size, k = rows // next_n, 2048, 64, 2048
    table = torch.randperm(requests * max_blocks, device="cuda").view(requests, max_blocks)
    lengths = torch.randint(k, max_blocks * block_size + 1, (requests,), device="cuda")
    used = (lengths + block_size - 1) // block_size
    table = torch.where(torch.arange(max_blocks, device="cuda") < used[:, None], table, -1)
    row_len = lengths.repeat_interleave(next_n)
    positions = torch.randint(0, 1 << 30, (requests * next_n, k), device="cuda") % row_len[:, None]
    positions[torch.rand(positions.shape, device="cuda") < 0.1] = -1
    positions[1, 1500:] = -1  # a row shorter than k
    positions, table = positions.to(torch.int32), table.to(torch.int32)
    want = reference(positions, table, block_size)
    assert torch.equal(to_slots(positions, table, block_size), want)


def test_route_and_to_slots_are_one_launch_each_and_replay_in_a_cuda_graph():
    """No host synchronisation and one kernel each: both capture, and a replay on new inputs
    gives what the reference computes on them."""
    from hwrun.kernels.triton.moe_route import route
    from hwrun.kernels.triton.to_slots import to_slots
    from hwrun.ops.moe_route import route as ref_route
    from hwrun.ops.topk import to_slots as ref_slots

    logits, bias = _router_logits(64, ties=True)
    table = torch.randperm(64 * 2048, device="cuda").view(64, 2048).to(torch.int32)
    positions = torch.randint(-1, 2048 * 64, (64, 2048), device="cuda", dtype=torch.int32)

    def step():
        routed = route(logits, 8, e_score_correction_bias=bias, **_DEEPSEEK_ROUTE)
        return routed, to_slots(positions, table, 64)

    step()  # compile outside the capture and the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sorted(kernels) == ["_route_kernel", "_to_slots_kernel"], kernels

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (weights, ids), slots = step()
    new_logits, new_bias = _router_logits(64, ties=True)
    logits.copy_(new_logits)
    bias.copy_(new_bias)
    positions.copy_(torch.randint(-1, 2048 * 64, (64, 2048), device="cuda", dtype=torch.int32))
    graph.replay()
    want_weights, want_ids = ref_route(logits, 8, e_score_correction_bias=bias, **_DEEPSEEK_ROUTE)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-5, rtol=1e-5)
    assert torch.equal(slots, ref_slots(positions, table, 64))


@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
def test_head_products_quantize_at_the_bench_models_heads(tokens):
    """The W_UV product that writes o_proj's codes, compiled: 64 heads over the 512-column
    latent as the engine calls it (the attention output seen through its [T, H, 512] strides);
    values within a bf16 unit of torch's batched GEMM, codes and scales byte-exact to the
    values' quantization, in DeepGEMM's scale layout, and as a graph replay."""
    from hwrun.formats.fp8 import quantize_fp8_groups
    from hwrun.kernels.triton.head_quant import head_products_quantize

    x = torch.randn(tokens, 64, 512, device="cuda").to(torch.bfloat16)
    w = (torch.randn(64, 128, 512, device="cuda") * 0.05).to(torch.bfloat16)
    values, (codes, scales) = head_products_quantize(x, w, token_major_scales=True)
    want = torch.bmm(x.transpose(0, 1), w.transpose(1, 2)).transpose(0, 1).reshape(tokens, -1)
    assert relative_error(values, want) < 2**-8
    want_codes, want_scales = quantize_fp8_groups(values.float(), 128)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed, (replayed_codes, _) = head_products_quantize(x, w, token_major_scales=True)
    x.copy_(torch.randn_like(x))
    graph.replay()
    eager, (eager_codes, _) = head_products_quantize(x, w, token_major_scales=True)
    assert torch.equal(replayed, eager) and torch.equal(replayed_codes, eager_codes)
