"""Projections that read the same input, joined into one weight so a step launches one product.

Per layer, q_a, the indexer's wk and kv_a all multiply the layer's input, and q_b and the
indexer's wq_b both multiply q_a's norm: five products, each a GEMM launch (and on the GPU
often a split-K sum), most of them too small to fill the device at decode batch sizes. Joined,
they are two. The joined weight holds the projections' rows in turn; each projection keeps its
name in the weights as a view into it, so nothing is stored twice.

Projections are joined only when they can share one weight: all tensors of one dtype, or all
block-FP8 of one format whose row counts, but the last one's, end on a 128-row scale tile (the
scale tiles then line up). Otherwise they stay separate, and the model calls them one by one.
Only an unsharded model is joined: tensor parallelism splits these projections differently.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

import torch

from hwrun.engine.linears import FusedLinear, Linear
from hwrun.engine.weights import ModelWeights
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight

FP8_FORMATS = ("fp8_block128", "fp8_block128_ue8m0")


def fuse_projections(weights: ModelWeights) -> ModelWeights:
    """``weights`` with each layer's ``from_hidden`` and ``from_q_lora`` set where the
    projections can be joined (their named projections then views into the joined weight)."""
    layers = []
    for layer in weights.layers:
        a, ix = layer.attention, layer.attention.indexer
        attention = a
        # kv_a last: its 576 rows end mid scale tile, which only the last part may
        hidden = _join([a.q_a_proj, ix.wk, a.kv_a_proj])
        if hidden is not None:
            fused, (q_a, wk, kv_a) = hidden
            ix = replace(ix, wk=wk)
            attention = replace(attention, q_a_proj=q_a, kv_a_proj=kv_a, from_hidden=fused)
        q_lora = _join([a.q_b_proj, ix.wq_b])
        if q_lora is not None:
            fused, (q_b, wq_b) = q_lora
            ix = replace(ix, wq_b=wq_b)
            attention = replace(attention, q_b_proj=q_b, from_q_lora=fused)
        layers.append(replace(layer, attention=replace(attention, indexer=ix)))
    return replace(weights, layers=tuple(layers))


def _join(linears: list[Linear]) -> tuple[FusedLinear, list[Linear]] | None:
    """One linear over the rows of ``linears`` and each of them as a view into it; None when
    they cannot share one weight (see the module docstring)."""
    weights = [linear.weight for linear in linears]
    rows = [w.shape[0] for w in weights]
    starts = [0, *accumulate(rows)]
    if all(isinstance(w, torch.Tensor) for w in weights):
        if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
            return None
        joined = torch.cat(weights)
        parts = [joined[start : start + n] for start, n in zip(starts, rows, strict=False)]
    elif all(isinstance(w, QuantizedWeight) for w in weights):
        if (
            len({(w.format, w.data.device, w.shape[1]) for w in weights}) != 1
            or weights[0].format not in FP8_FORMATS
            or any(w.data.dim() != 2 for w in weights)
            or any(n % FP8_BLOCK for n in rows[:-1])
        ):
            return None
        data = torch.cat([w.data for w in weights])
        scales = torch.cat([w.scales for w in weights])
        fmt, columns = weights[0].format, weights[0].shape[1]
        name = " + ".join(w.name for w in weights)
        joined = QuantizedWeight(fmt, (starts[-1], columns), data, scales, name=name)
        parts = [
            QuantizedWeight(
                fmt,
                (n, columns),
                data[start : start + n],
                scales[start // FP8_BLOCK : start // FP8_BLOCK + -(-n // FP8_BLOCK)],
                name=w.name,
            )
            for w, start, n in zip(weights, starts, rows, strict=False)
        ]
    else:
        return None
    fused = FusedLinear(Linear(joined), tuple(rows))
    return fused, [
        replace(linear, weight=part) for linear, part in zip(linears, parts, strict=True)
    ]
