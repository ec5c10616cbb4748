"""Tensor parallelism: one rank's shard of the weights, and the sums that join the shards.

Megatron's split, as vLLM runs DeepSeek-V3 under TP:

- attention: the MLA heads are split across ranks (``q_b_proj`` rows, ``W_UK`` / ``W_UV``, the
  ``o_proj`` columns of those heads); every rank computes the shared latent and the DSA indexer
  for all tokens and keeps the whole KV cache (the latent is shared by all heads: that is why
  decode context parallelism exists);
- dense MLP and experts (routed and shared): the intermediate dimension is split (``gate`` and
  ``up`` rows, ``down`` columns); routing runs on every rank, on the same replicated router;
- the partial outputs of ``o_proj`` and of each MLP / MoE are summed across ranks (all-reduce);
  embeddings, norms and the LM head are replicated, so every rank ends with the same logits.

:func:`tp_reasons` says why a model cannot be split W ways (all reasons at once).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hwrun.engine.linears import Linear
from hwrun.engine.model_config import ModelConfig
from hwrun.engine.weights import DenseMLPWeights, LayerWeights, ModelWeights, MoEWeights
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight

SPLITTABLE = ("bf16", "fp8_block128", "fp8_block128_ue8m0")


def tp_reasons(
    config: ModelConfig, world: int, expert_format: str, linear_formats: tuple[str, ...] = ()
) -> list[str]:
    """Every reason ``config`` cannot be split across ``world`` ranks (``linear_formats``: those
    of the dense linears kept quantized, see ``linears.quantized_linear_formats``)."""
    if world == 1:
        return []
    reasons = []
    for name, value in (
        ("num_attention_heads", config.num_heads),
        ("intermediate_size", config.intermediate_size),
        ("moe_intermediate_size", config.moe_intermediate_size),
    ):
        if value % world:
            reasons.append(f"{name} {value} is not divisible by --tp {world}")
    if expert_format not in SPLITTABLE:
        reasons.append(f"experts in {expert_format} cannot be split by rows yet ({SPLITTABLE})")
    elif expert_format != "bf16" and (config.moe_intermediate_size // world) % FP8_BLOCK:
        reasons.append(
            f"block-FP8 experts split {world} ways need moe_intermediate_size / tp to be a "
            f"multiple of {FP8_BLOCK}, got {config.moe_intermediate_size // world}"
        )
    if any(fmt != "bf16" for fmt in linear_formats) and not reasons:
        heads = config.num_heads // world
        widths = {
            "q_b_proj rows (heads x qk_head_dim)": heads * config.qk_head_dim,
            "o_proj columns (heads x v_head_dim)": heads * config.v_head_dim,
        }
        if not all(config.moe_layers):
            widths["dense MLP width (intermediate_size / tp)"] = config.intermediate_size // world
        reasons += [
            f"block-FP8 projections split {world} ways need each rank's {what} to be a multiple "
            f"of {FP8_BLOCK} (whole scale tiles), got {width}"
            for what, width in widths.items()
            if width % FP8_BLOCK
        ]
    return reasons


def shard_config(config: ModelConfig, world: int) -> ModelConfig:
    """The shapes one rank computes: its heads and its slice of every intermediate dimension."""
    return replace(
        config,
        num_heads=config.num_heads // world,
        intermediate_size=config.intermediate_size // world,
        moe_intermediate_size=config.moe_intermediate_size // world,
    )


def shard_weights(
    weights: ModelWeights, config: ModelConfig, rank: int, world: int
) -> ModelWeights:
    """Rank ``rank``'s shard of ``weights`` (``config`` is the whole model's)."""
    if world == 1:
        return weights
    layers = tuple(_shard_layer(layer, config, rank, world) for layer in weights.layers)
    return replace(weights, layers=layers)


def _part(size: int, rank: int, world: int) -> slice:
    step = size // world
    return slice(rank * step, (rank + 1) * step)


def _rows(linear: Linear, part: slice) -> Linear:
    w = linear.weight
    if isinstance(w, QuantizedWeight):
        scales = None if w.scales is None else w.scales[_tiles(part, True)].contiguous()
        shape = (part.stop - part.start, w.shape[1])
        w = QuantizedWeight(w.format, shape, w.data[part].contiguous(), scales, name=w.name)
        return replace(linear, weight=w)
    return replace(linear, weight=w[part].contiguous())


def _cols(linear: Linear, part: slice) -> Linear:
    w = linear.weight
    if isinstance(w, QuantizedWeight):
        return replace(linear, weight=_down_cols_part(w, part, w.name))
    return replace(linear, weight=w[:, part].contiguous())


def _shard_layer(layer: LayerWeights, config: ModelConfig, rank: int, world: int) -> LayerWeights:
    a = layer.attention
    heads = _part(config.num_heads, rank, world)
    qk, v = config.qk_head_dim, config.v_head_dim
    q_rows = slice(heads.start * qk, heads.stop * qk)
    attention = replace(
        a,
        q_b_proj=_rows(a.q_b_proj, q_rows),
        w_uk=a.w_uk[heads].contiguous(),
        w_uv=a.w_uv[heads].contiguous(),
        o_proj=_cols(a.o_proj, slice(heads.start * v, heads.stop * v)),
    )
    mlp = layer.mlp
    if isinstance(mlp, DenseMLPWeights):
        part = _part(config.intermediate_size, rank, world)
        mlp = DenseMLPWeights(
            gate_proj=_rows(mlp.gate_proj, part),
            up_proj=_rows(mlp.up_proj, part),
            down_proj=_cols(mlp.down_proj, part),
        )
    else:
        mlp = _shard_moe(mlp, rank, world)
    return replace(layer, attention=attention, mlp=mlp)


def _shard_moe(mlp: MoEWeights, rank: int, world: int) -> MoEWeights:
    shared = None
    if mlp.shared is not None:
        shared = (_gate_up_rows(mlp.shared[0], rank, world), _down_cols(mlp.shared[1], rank, world))
    return replace(
        mlp,
        w13=_gate_up_rows(mlp.w13, rank, world),
        w2=_down_cols(mlp.w2, rank, world),
        shared=shared,
    )


def _tiles(part: slice, scaled: bool) -> slice:
    """The rows (or columns) of a block-FP8 weight's scales that cover ``part`` (which starts
    on a tile boundary: tp_reasons checks it)."""
    if not scaled:
        return part
    return slice(part.start // FP8_BLOCK, -(-part.stop // FP8_BLOCK))


def _gate_up_rows(w: QuantizedWeight, rank: int, world: int) -> QuantizedWeight:
    """``[.., 2I, C]`` (gate rows then up rows) -> this rank's gate rows then its up rows."""
    inter = w.shape[-2] // 2
    part = _part(inter, rank, world)
    up = slice(inter + part.start, inter + part.stop)
    scaled = w.scales is not None

    def take(t: torch.Tensor, is_scale: bool) -> torch.Tensor:
        first, second = (_tiles(part, is_scale), _tiles(up, is_scale))
        return torch.cat([t[..., first, :], t[..., second, :]], dim=-2).contiguous()

    data = take(w.data, False)
    scales = take(w.scales, True) if scaled else None
    shape = (*w.shape[:-2], 2 * (part.stop - part.start), w.shape[-1])
    return QuantizedWeight(w.format, shape, data, scales, name=f"{w.name}[tp{rank}]")


def _down_cols(w: QuantizedWeight, rank: int, world: int) -> QuantizedWeight:
    """``[.., R, I]`` -> this rank's slice of the I columns."""
    return _down_cols_part(w, _part(w.shape[-1], rank, world), f"{w.name}[tp{rank}]")


def _down_cols_part(w: QuantizedWeight, part: slice, name: str) -> QuantizedWeight:
    data = w.data[..., part].contiguous()
    scales = None if w.scales is None else w.scales[..., _tiles(part, True)].contiguous()
    shape = (*w.shape[:-1], part.stop - part.start)
    return QuantizedWeight(w.format, shape, data, scales, name=name)
