"""The AITER indexer adapters against a fake AITER (fake_aiter.py) and hwrun's references: each
convention converted is checked, and a negative control per adapter shows the check fails when
the conversion is skipped or done the other library's way."""

from __future__ import annotations

import pytest
import torch

from hwrun.formats.fp8 import quantize_fp8_groups
from hwrun.formats.index_keys import get_index_key_format
from hwrun.ops import indexer as ref_indexer
from hwrun.ops import kv_write as ref_kv_write
from hwrun.ops import topk as ref_topk
from hwrun.registry import OpRegistry, OpSpec
from hwrun_amd import aiter_indexer, aiter_library, device_checks, plugin

FP8_KEYS = get_index_key_format("fp8")


def _fp8_query(g, *shape):  # codes of an fp8 query, its scale folded into the weights elsewhere
    codes, _ = quantize_fp8_groups(torch.randn(*shape, generator=g) * 3, group=shape[-1])
    return codes.view(torch.float8_e4m3fn)


def _ragged_problem(g, rows=5, heads=4, keys=300):
    elements, scales = FP8_KEYS.encode(torch.randn(keys, 128, generator=g))
    ks = torch.randint(0, 100, (rows,), generator=g, dtype=torch.int32)
    ke = torch.minimum(
        ks + torch.randint(0, 250, (rows,), generator=g, dtype=torch.int32),
        torch.tensor(keys, dtype=torch.int32),
    )
    weights = torch.rand(rows, heads, generator=g)
    return (_fp8_query(g, rows, heads, 128), weights, elements, scales, "fp8", ks, ke)


def _same_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape or not torch.equal(torch.isinf(got), torch.isinf(want)):
        return False
    finite = torch.isfinite(want)
    return torch.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("arch", "moved"), [("gfx950", True), ("gfx942", True), ("gfx942", False)])
def test_ragged_logits_match_the_reference(fake_aiter, arch, moved):
    fake = fake_aiter(arch, moved_logits=moved)
    args = _ragged_problem(torch.Generator().manual_seed(1))
    got = aiter_indexer.logits_ragged(*args)
    assert fake.calls == ["fp8_mqa_logits"]
    assert _same_logits(got, ref_indexer.logits_ragged(*args))


def test_ragged_negative_control_gfx942_without_the_fnuz_conversion(fake_aiter, monkeypatch):
    # An AITER release that reads the bytes as FNUZ (before July 2026) and an adapter that does
    # not convert: every score is a quarter of the contract's.
    fake_aiter("gfx942", moved_logits=False)
    monkeypatch.setattr(aiter_indexer, "FNUZ_FP8_ARCHS", ())
    args = _ragged_problem(torch.Generator().manual_seed(1))
    assert not _same_logits(aiter_indexer.logits_ragged(*args), ref_indexer.logits_ragged(*args))


def _paged_problem(g, block=16, heads=4):
    lens = torch.tensor([[5, 9], [37, 3]], dtype=torch.int32)  # not the causal next_n offsets
    blocks_per_request = 3
    table = torch.randperm(8, generator=g)[: 2 * blocks_per_request].reshape(2, -1).int()
    cache = torch.zeros(8, block * FP8_KEYS.bytes_per_token, dtype=torch.uint8)
    slots = (table.long()[:, :, None] * block + torch.arange(block)).reshape(2, -1)
    keys = torch.randn(slots.numel(), 128, generator=g)
    ref_kv_write.write_index_keys(cache, keys, slots.reshape(-1).int(), "fp8")
    weights = torch.rand(4, heads, generator=g)
    return (_fp8_query(g, 2, 2, heads, 128), weights, cache, "fp8", table, lens, 48)


def test_paged_logits_give_every_row_its_own_length(fake_aiter):
    fake = fake_aiter("gfx950")
    args = _paged_problem(torch.Generator().manual_seed(2))
    got = aiter_indexer.logits_paged(*args)
    assert fake.calls == ["deepgemm_fp8_paged_mqa_logits"]
    assert _same_logits(got, ref_indexer.logits_paged(*args))


def test_paged_negative_control_next_n_rows_of_one_request(fake_aiter):
    # DeepGEMM's form (next_n rows per request, one length each, causal offsets) read with the
    # contract's per-row lengths gives other rows: the adapter must not pass it that way.
    fake = fake_aiter("gfx950")
    q, weights, cache, _, table, lens, max_ctx = _paged_problem(torch.Generator().manual_seed(2))
    out = torch.full((4, max_ctx), float("-inf"))
    kv_cache = cache.view(8, 16, 1, FP8_KEYS.bytes_per_token)
    fake.deepgemm_fp8_paged_mqa_logits(
        q, kv_cache, weights, out, lens[:, -1].contiguous(), table, max_ctx, KVBlockSize=16
    )
    want = ref_indexer.logits_paged(q, weights, cache, "fp8", table, lens, max_ctx)
    assert not _same_logits(out, want)


def test_paged_logits_refuse_gfx942(fake_aiter):
    fake_aiter("gfx942")
    with pytest.raises(ValueError, match="in place as FNUZ"):
        aiter_indexer.logits_paged(*_paged_problem(torch.Generator().manual_seed(2)))


def _topk_problem(g, starts):
    rows = len(starts)
    logits = torch.randn(rows, 400, generator=g)
    starts = torch.tensor(starts, dtype=torch.int32)
    ends = torch.minimum(
        starts + torch.tensor([300, 40, 128, 0][:rows], dtype=torch.int32), torch.tensor(400)
    )
    return logits, starts, ends.int(), 128


def _rows_as_sets(t: torch.Tensor) -> torch.Tensor:
    return t.sort(dim=1).values


@pytest.mark.parametrize(
    ("starts", "kernel"), [([5, 0, 200, 7], "prefill"), ([0, 0, 0, 0], "decode")]
)
def test_topk_indices_relative_to_each_row_start(fake_aiter, starts, kernel):
    fake = fake_aiter("gfx942")
    args = _topk_problem(torch.Generator().manual_seed(3), starts)
    got = aiter_indexer.topk(*args)
    assert fake.calls == [f"top_k_per_row_{kernel}"]
    assert torch.equal(_rows_as_sets(got), _rows_as_sets(ref_topk.topk(*args)))


def test_topk_negative_control_column_indices(fake_aiter, monkeypatch):
    fake_aiter("gfx942")
    monkeypatch.setattr(aiter_indexer, "relative_to_starts", lambda indices, starts: indices)
    args = _topk_problem(torch.Generator().manual_seed(3), [5, 0, 200, 7])
    got = aiter_indexer.topk(*args)
    assert not torch.equal(_rows_as_sets(got), _rows_as_sets(ref_topk.topk(*args)))


def _write_problem(g, tokens=40, blocks=6, block=16):
    keys = (torch.randn(tokens, 128, generator=g) * 4).to(torch.bfloat16)
    slots = torch.randperm(blocks * block, generator=g)[:tokens].int()
    slots[3] = -1
    return keys, slots, torch.zeros(blocks, block * FP8_KEYS.bytes_per_token, dtype=torch.uint8)


def test_index_key_writes_are_hwrun_bytes(fake_aiter):
    fake = fake_aiter("gfx950")
    keys, slots, cache = _write_problem(torch.Generator().manual_seed(4))
    want = cache.clone()
    aiter_indexer.write_index_keys(cache, keys, slots, "fp8")
    ref_kv_write.write_index_keys(want, keys, slots, "fp8")
    assert fake.calls == ["indexer_k_quant_and_cache"]
    assert torch.equal(cache, want)


def test_index_key_negative_control_plain_scales(fake_aiter, monkeypatch):
    # AITER's other scale_fmt (amax / 448, not a power of two) is not hwrun's fp8 key rule.
    fake_aiter("gfx950")
    monkeypatch.setattr(aiter_indexer, "FP8_KEY_SCALE_FORMAT", "")
    keys, slots, cache = _write_problem(torch.Generator().manual_seed(4))
    want = cache.clone()
    aiter_indexer.write_index_keys(cache, keys, slots, "fp8")
    ref_kv_write.write_index_keys(want, keys, slots, "fp8")
    assert not torch.equal(cache, want)


def test_index_key_writes_refuse_a_strided_cache_and_gfx942(fake_aiter):
    fake_aiter("gfx950")
    keys, slots, cache = _write_problem(torch.Generator().manual_seed(4))
    packed = torch.zeros(6, 2 * cache.shape[1], dtype=torch.uint8)[:, : cache.shape[1]]
    with pytest.raises(ValueError, match="contiguous"):
        aiter_indexer.write_index_keys(packed, keys, slots, "fp8")
    fake_aiter("gfx942")
    with pytest.raises(ValueError, match="FNUZ"):
        aiter_indexer.write_index_keys(cache, keys, slots, "fp8")


@pytest.fixture
def rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_checks, "_rocm_available", lambda: True)


@pytest.mark.parametrize(
    ("op", "spec", "needle"),
    [
        ("indexer.logits_paged", {"arch": "gfx942", "dtype": "float8_e4m3fn"}, "gfx950 only"),
        ("indexer.logits_ragged", {"arch": "gfx942", "dtype": "bfloat16"}, "query dtype"),
        ("indexer.logits_ragged", {"num_heads": 12, "dtype": "float8_e4m3fn"}, "power-of-two"),
        ("indexer.logits_paged", {"block_size": 48, "dtype": "float8_e4m3fn"}, "dividing 256"),
        ("kv.write_index_keys", {"formats": ("mxfp4",)}, "index-key format"),
        ("kv.write_index_keys", {"arch": "gfx942"}, "gfx950 only"),
    ],
)
def test_validate_refuses_what_aiter_refuses(rocm, op, spec, needle):
    fields = {"device_type": "cuda", "arch": "gfx950", **spec}
    validate = next(v for o, _, v, _ in aiter_indexer.ADAPTERS if o == op)
    reasons = validate(OpSpec(op=op, **fields))
    assert any(needle in r for r in reasons), reasons
    ok = {"device_type": "cuda", "arch": "gfx950", "dtype": "float8_e4m3fn"}
    if op.startswith("kv."):
        ok = {"device_type": "cuda", "arch": "gfx950", "formats": ("fp8",)}
    assert validate(OpSpec(op=op, **ok)) == []


def test_adapters_register_above_triton_only_with_amds_aiter(fake_aiter, monkeypatch):
    aiter_library.aiter_problem.cache_clear()
    monkeypatch.setattr(aiter_library.importlib.util, "find_spec", lambda name: None)
    registry = OpRegistry("amd")
    plugin.hwrun_register_ops(registry)
    assert [i.name for i in registry.impls("indexer.topk")] == ["triton"]
    assert "pip install amd-aiter" in aiter_library.aiter_problem()
    monkeypatch.undo()
    fake_aiter("gfx950")
    registry = OpRegistry("amd")
    plugin.hwrun_register_ops(registry)
    impls = registry.impls("indexer.topk")
    assert {i.name for i in impls} == {"triton", "aiter"}
    assert max(impls, key=lambda i: i.priority).name == "aiter"
    assert all("not validated on hardware" in i.description for i in impls if i.name == "aiter")


def test_the_unrelated_aiter_package_is_not_taken_for_amds(monkeypatch):
    import sys
    import types

    unrelated = types.ModuleType("aiter")  # PyPI's "aiter": async iteration helpers
    unrelated.__spec__ = __import__("importlib").machinery.ModuleSpec("aiter", None)
    monkeypatch.setitem(sys.modules, "aiter", unrelated)
    aiter_library.aiter_problem.cache_clear()
    assert "not AMD's AITER" in aiter_library.aiter_problem()
    aiter_library.aiter_problem.cache_clear()
