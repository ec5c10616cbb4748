"""The Gluon paged-logits kernels (mxfp4 and fp8 keys) on an H200 (sm_90) against the reference,
on fresh random keys: ragged and empty requests, padded head counts, the split and stage
options, an mxfp4 key whose group exponents span too much to fold (the four-product path), a
NaN scale code, pages past a request and rows past max_ctx, the engine's decode shape, CUDA-graph
replay, and the registry choosing them under HWRUN_GLUON=1.

Run on the H200 with ``PYTHONPATH=core:plugins/nvidia:. pytest plugins/nvidia/tests``.
"""

from __future__ import annotations

import pytest
import torch

from hwrun.ops import indexer as ref_indexer
from tests.kernels.gpu_inputs import needs_sm90, paged_inputs, relative_error

pytestmark = needs_sm90


def _kernel():
    return pytest.importorskip("hwrun_nvidia.gluon_paged_logits")


FORMATS = ["mxfp4", "fp8"]


def _check(q, w, cache, table, lens, max_ctx, fmt="mxfp4", **options):
    got = _kernel().logits_paged(q, w, cache, fmt, table, lens, max_ctx, **options)
    want = ref_indexer.logits_paged(q, w, cache, fmt, table, lens, max_ctx)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert relative_error(got[keep], want[keep]) < 2e-3
    return got


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads", [64, 32, 10, 128])
def test_matches_the_reference(fmt, heads):
    torch.manual_seed(heads)
    q, w, cache, table, lens = paged_inputs(fmt, 5, 4096, heads, 1, torch.float8_e4m3fn)
    lens[1], lens[2], lens[3] = 1, 63, 65  # a token, a page but one, a page and one
    _check(q, w, cache, table, lens, 4096, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("splits,stages", [(1, 3), (3, 4), (None, 6), (64, 8)])
def test_every_split_and_stage_count(fmt, splits, stages):
    """One page an iteration, uncapped (mxfp4's default form has its own tests below)."""
    torch.manual_seed(7)
    q, w, cache, table, lens = paged_inputs(fmt, 3, 8192, 64, 1, torch.float8_e4m3fn)
    one_page = {"pairs": False, "max_registers": None}
    _check(q, w, cache, table, lens, 8192, fmt, splits=splits, stages=stages, **one_page)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("requests,max_ctx", [(1, 4096), (5, 4096), (37, 320), (64, 32768)])
def test_the_persistent_grid(fmt, requests, max_ctx):
    """Equal contiguous shares of all requests' pages: one request, shares straddling requests
    (320 columns: 5 pages a request, about 4 a share), ragged and empty requests (paged_inputs'
    first), the pages past a request's keys written -inf by whichever share holds them."""
    torch.manual_seed(requests)
    q, w, cache, table, lens = paged_inputs(fmt, requests, max_ctx, 64, 1, torch.float8_e4m3fn)
    if requests > 3:
        lens[1], lens[2], lens[3] = 1, 63, 65
    got = _check(q, w, cache, table, lens, max_ctx, fmt, persistent=True)
    if requests > 3:
        assert (got[0] == float("-inf")).all()  # paged_inputs' empty request
        assert (got[1, 1:] == float("-inf")).all()
    with pytest.raises(ValueError, match="persistent"):
        _kernel().logits_paged(q, w, cache, fmt, table, lens, max_ctx, persistent=True, splits=2)


@pytest.mark.parametrize("heads", [64, 10])
@pytest.mark.parametrize("splits,stages", [(1, 2), (3, 4), (None, 2), (64, 8)])
def test_the_fp8_kernels_overlapped_form(heads, splits, stages):
    """Each page's MMA async beside the last page's sums: the first page (nothing to store
    yet), the last (stored after the loop), a program with no page, ragged and empty rows."""
    torch.manual_seed(heads + stages)
    q, w, cache, table, lens = paged_inputs("fp8", 5, 8192, heads, 1, torch.float8_e4m3fn)
    lens[1], lens[2], lens[3] = 1, 63, 8192
    _check(q, w, cache, table, lens, 8192, "fp8", splits=splits, stages=stages, overlap=True)


@pytest.mark.parametrize("splits,stages", [(None, 6), (5, 3)])
def test_the_mxfp4_kernel_capped_at_128_registers(splits, stages):
    torch.manual_seed(stages)
    q, w, cache, table, lens = paged_inputs("mxfp4", 5, 8192, 64, 1, torch.float8_e4m3fn)
    lens[1], lens[2] = 1, 65
    _check(q, w, cache, table, lens, 8192, splits=splits, stages=stages, pairs=False)


@pytest.mark.parametrize("heads", [64, 10, 128])
@pytest.mark.parametrize("splits,stages", [(1, 4), (3, 6), (None, 8), (64, 4)])
def test_the_mxfp4_kernels_paired_form(heads, splits, stages):
    """Two pages an iteration: a program with an odd count of pages (its last pair half past
    the keys), one with a single page, none, and ragged and empty rows."""
    torch.manual_seed(heads + stages)
    q, w, cache, table, lens = paged_inputs("mxfp4", 5, 8192, heads, 1, torch.float8_e4m3fn)
    lens[1], lens[2], lens[3] = 1, 63, 64 * 7 + 5  # 1 page, 1 page, 8 pages (odd per 3 splits)
    uncapped = {"pairs": True, "max_registers": None}
    _check(q, w, cache, table, lens, 8192, splits=splits, stages=stages, **uncapped)
    _check(q, w, cache, table, lens, 8192, stages=stages, pairs=True, max_registers=128)


@pytest.mark.parametrize(
    "heads,splits", [(64, 1), (64, 3), (64, 64), (64, None), (10, None), (128, 3)]
)
def test_the_mxfp4_kernels_register_form(heads, splits):
    """The codes in registers, STAGES pages an iteration: programs whose page counts leave 1,
    2 or 3 of the last four (3 splits of 8 pages), a single page, none, ragged and empty rows;
    the split grid and the persistent one (splits None), capped at 128 registers and not."""
    torch.manual_seed(heads + (splits or 0))
    q, w, cache, table, lens = paged_inputs("mxfp4", 5, 8192, heads, 1, torch.float8_e4m3fn)
    lens[1], lens[2], lens[3] = 1, 63, 64 * 7 + 5
    for cap in (None, 128):
        _check(q, w, cache, table, lens, 8192, splits=splits, registers=True, max_registers=cap)
        # overlapped: each page's logits stored beside the next page's MMA, the last after
        _check(q, w, cache, table, lens, 8192, splits=splits, overlap=True, max_registers=cap)
    if heads == 64:  # six stages: six pages an iteration, a different count of the last left
        _check(q, w, cache, table, lens, 8192, splits=splits, registers=True, stages=6)
        _check(q, w, cache, table, lens, 8192, splits=splits, overlap=True, stages=6)


@pytest.mark.parametrize("heads", [64, 10])
@pytest.mark.parametrize(
    "requests,max_ctx,stages",
    [(5, 8192, 12), (37, 320, 12), (1, 131072, 12), (3, 8192, 5), (64, 32768, 8), (2, 128, 12)],
)
def test_the_mxfp4_kernels_specialised_form(heads, requests, max_ctx, stages):
    """Loader warps feeding three consumer warpgroups through the TMA ring: shares straddling
    requests (320 columns: 5 pages a request), ragged, empty, one-token and one-page-but-one
    requests, pages past a request's keys, a request long enough to wrap the ring many times,
    the smallest ring (5 stages: 4 pages ahead of the decisions), and shares of fewer pages
    than there are consumers (128 columns: 2 pages a request)."""
    torch.manual_seed(heads + requests + stages)
    q, w, cache, table, lens = paged_inputs("mxfp4", requests, max_ctx, heads, 1,
                                            torch.float8_e4m3fn)  # fmt: skip
    if requests > 3:
        lens[1], lens[2], lens[3] = 1, 63, 64 * 3 + 5
    got = _check(q, w, cache, table, lens, max_ctx, specialised=True, stages=stages)
    if requests > 3:
        assert (got[0] == float("-inf")).all()  # paged_inputs' empty request
        assert (got[1, 1:] == float("-inf")).all()


def test_the_forms_refuse_what_they_do_not_take():
    q, w, cache, table, lens = paged_inputs("mxfp4", 1, 256, 64, 1, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="even stages >= 4"):
        _kernel().logits_paged(q, w, cache, "mxfp4", table, lens, 256, pairs=True, stages=5)
    q, w, cache, table, lens = paged_inputs("fp8", 1, 256, 64, 1, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="mxfp4 keys' kernel only"):
        _kernel().logits_paged(q, w, cache, "fp8", table, lens, 256, pairs=True)
    with pytest.raises(ValueError, match="mxfp4 keys' kernel only"):
        _kernel().logits_paged(q, w, cache, "fp8", table, lens, 256, registers=True)


def test_mxfp4_overlap_is_refused_outside_the_register_form():
    q, w, cache, table, lens = paged_inputs("mxfp4", 1, 256, 64, 1, torch.float8_e4m3fn)
    for other in ({"registers": False}, {"pairs": True}):
        with pytest.raises(ValueError, match="mxfp4 register form"):
            _kernel().logits_paged(q, w, cache, "mxfp4", table, lens, 256, overlap=True, **other)


@pytest.mark.parametrize(
    "fmt,options",
    [("mxfp4", {}), ("fp8", {}), ("mxfp4", {"specialised": True})],
    ids=["mxfp4", "fp8", "mxfp4-specialised"],
)
def test_max_ctx_cuts_rows_and_pages_past_it(fmt, options):
    torch.manual_seed(3)
    q, w, cache, table, lens = paged_inputs(fmt, 4, 4096, 64, 1, torch.float8_e4m3fn)
    lens.clamp_(max=3000)
    # 3001 columns: the last page cut short
    got = _check(q, w, cache, table, lens, 3001, fmt, **options)
    assert got.shape == (4, 3001)
    assert (got[0] == float("-inf")).all()  # paged_inputs' empty request


@pytest.mark.parametrize(
    "options",
    [
        {"pairs": False},
        {"pairs": True, "stages": 4},
        {"registers": True, "pairs": False},
        {"overlap": True},
        {"specialised": True},
    ],
    ids=["pages", "pairs", "registers", "overlap", "specialised"],
)
def test_groups_too_far_apart_to_fold_and_a_nan_code(options):
    """One key's first group 2^-12 of its others (its e8m0 code ~12 lower: the page, or with
    ``pairs`` its pair, takes the four products), another key's scale code 255 (NaN: its score
    is NaN, as the reference's)."""
    from hwrun.formats.index_keys import get_index_key_format

    torch.manual_seed(5)
    blocks, heads = 8, 64
    values = torch.randn(blocks * 64, 128, device="cuda")
    values[70, :32] *= 2.0**-12  # page 1, token 6
    elements, scales = get_index_key_format("mxfp4").encode(values)
    cache = torch.cat((elements.reshape(blocks, -1), scales.reshape(blocks, -1)), 1)
    cache[3, 64 * 64 + 9 * 4 + 2] = 255  # page 3, token 9, group 2
    codes = cache[1, 64 * 64 + 6 * 4 : 64 * 64 + 7 * 4].int()
    assert codes.max() - codes.min() > 5  # really past MAX_FOLD
    table = torch.arange(blocks, device="cuda", dtype=torch.int32).reshape(2, 4)
    q = torch.randn(2, 1, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(2, heads, device="cuda")
    lens = torch.tensor([[256], [256]], device="cuda", dtype=torch.int32)
    got = _check(q, w, cache, table, lens, 256, **options)
    assert torch.isnan(got[0, 3 * 64 + 9]) and torch.isnan(got).sum() == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_engines_decode_shape(fmt):
    """64 requests of 32K tokens (the bench model's 64 index heads), pages in random order."""
    torch.manual_seed(11)
    q, w, cache, table, lens = paged_inputs(fmt, 64, 32768, 64, 1, torch.float8_e4m3fn)
    _check(q, w, cache, table, lens, 32768, fmt)


@pytest.mark.parametrize(
    "fmt,options",
    [("mxfp4", {}), ("fp8", {}), ("mxfp4", {"specialised": True})],
    ids=["mxfp4", "fp8", "mxfp4-specialised"],
)
def test_graph_replay_matches_eager(fmt, options):
    """(The specialised form's TMA descriptors are kernel parameters, captured by value.)"""
    from test_adapters_gpu import _replay_matches_eager  # this directory, on sys.path in tests

    kernel = _kernel()

    def make_inputs():
        return paged_inputs(fmt, 4, 4096, 64, 1, torch.float8_e4m3fn)

    def fn(q, w, cache, table, lens):
        return (kernel.logits_paged(q, w, cache, fmt, table, lens, 4096, **options),)

    _replay_matches_eager(fn, make_inputs)


def test_served_under_the_switch(monkeypatch):
    import importlib.util

    from hwrun.registry import OpRegistry, OpSpec
    from hwrun_nvidia import plugin

    monkeypatch.setenv("HWRUN_GLUON", "1")
    registry = OpRegistry("nvidia")
    plugin.hwrun_register_ops(registry)
    has_deepgemm = importlib.util.find_spec("deep_gemm") is not None
    for fmt in FORMATS:
        spec = OpSpec(
            op="indexer.logits_paged", dtype="float8_e4m3fn", formats=(fmt,), num_heads=64,
            head_dim=128, block_size=64, device_type="cuda", arch="sm_90",
        )  # fmt: skip
        impl = registry.select(spec).impl
        assert impl.name == ("deepgemm" if fmt == "fp8" and has_deepgemm else "gluon")
        gluon_impl = next(i for i in registry.impls("indexer.logits_paged") if i.name == "gluon")
        for next_n in (1, 2):  # two query rows a request: the adapter hands the call to Triton's
            q, w, cache, table, lens = paged_inputs(fmt, 2, 4096, 64, next_n, torch.float8_e4m3fn)
            got = gluon_impl.fn(q, w, cache, fmt, table, lens, 4096)
            want = ref_indexer.logits_paged(q, w, cache, fmt, table, lens, 4096)
            assert relative_error(got, want) < 2e-3
