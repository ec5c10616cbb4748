"""Projections of one input joined into one weight: the model computes what it computed with
them apart, the named projections are views into the joined weight (stored once), and what
cannot share a weight stays apart."""

from __future__ import annotations

from dataclasses import replace

import torch

from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.config import EngineConfig
from hwrun.engine.fused_projections import _join
from hwrun.engine.linears import Linear
from hwrun.engine.model_runner import build_model_runner
from hwrun.engine.weights import tensor_bytes
from hwrun.ops.quantized_weight import quantize_weight
from tests.engine.tiny_checkpoints import build_tiny_model


def _apart(weights):
    layers = [
        replace(layer, attention=replace(layer.attention, from_hidden=None, from_q_lora=None))
        for layer in weights.layers
    ]
    return replace(weights, layers=tuple(layers))


def _shares_storage(part: torch.Tensor, whole: torch.Tensor) -> bool:
    return part.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()


def test_joined_projections_compute_what_separate_ones_do(tmp_path):
    build_tiny_model(tmp_path, seed=8, index_topk=16)
    runner = build_model_runner(
        EngineConfig(model=str(tmp_path), platform="reference", num_kv_tokens=8 * 64)
    )
    a = runner.model.weights.layers[0].attention
    assert a.from_hidden is not None and a.from_q_lora is not None
    assert a.from_hidden.widths == (
        a.q_a_proj.weight.shape[0],
        a.indexer.wk.weight.shape[0],
        a.kv_a_proj.weight.shape[0],
    )
    joined = a.from_hidden.linear.weight
    for part in (a.q_a_proj, a.kv_a_proj, a.indexer.wk):
        assert _shares_storage(part.weight, joined)  # a view: stored once
    assert tensor_bytes(a) == tensor_bytes(_apart(runner.model.weights).layers[0].attention)

    prompt = list(range(3, 75))
    chunk = ScheduledChunk(0, prompt, 0, [1, 2], True, all_logits=True)
    joined_logits = runner.execute([chunk])[0].logits
    runner.model.weights = _apart(runner.model.weights)
    apart_logits = runner.execute([chunk])[0].logits
    # the same products; only the BLAS's blocking over the wider weight may differ
    torch.testing.assert_close(joined_logits, apart_logits, rtol=1e-5, atol=1e-5)


def test_block_fp8_projections_join_on_whole_scale_tiles_only():
    g = torch.Generator().manual_seed(2)

    def fp8(rows, cols=256, name="w"):
        return Linear(quantize_weight(torch.randn(rows, cols, generator=g), "fp8_block128", name))

    parts = [fp8(256, name="a"), fp8(128, name="b"), fp8(200, name="c")]  # the last may be ragged
    fused, views = _join(parts)
    whole = fused.linear.weight
    assert whole.shape == (584, 256) and fused.widths == (256, 128, 200)
    want = torch.cat([p.weight.dequantize() for p in parts])
    assert torch.equal(whole.dequantize(), want)
    for view, part in zip(views, parts, strict=True):
        assert torch.equal(view.weight.dequantize(), part.weight.dequantize())
        assert _shares_storage(view.weight.data, whole.data)
    # a ragged part before another would put the next one's rows in its last scale tile
    assert _join([fp8(200), fp8(128)]) is None
    # formats that differ cannot share a weight
    assert _join([fp8(128), Linear(torch.randn(128, 256, generator=g))]) is None
