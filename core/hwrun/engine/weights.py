"""A DeepseekV32 checkpoint's tensors, loaded into the shapes the engine's graph uses.

Names follow DeepSeek's Hugging Face checkpoints (what transformers' ``save_pretrained`` writes,
too): per-expert ``mlp.experts.{e}.{gate,up,down}_proj``, ``mlp.gate`` the router,
``self_attn.indexer.*``. transformers 5's in-memory layout, fused ``mlp.experts.gate_up_proj``
``[E, 2I, D]`` and ``mlp.experts.down_proj`` ``[E, D, I]`` (what a raw ``state_dict`` holds), is
read as well.
A weight stored as FP8 E4M3 with a sibling ``weight_scale_inv`` (fp32, one per 128x128 tile) is
block-FP8 as DeepSeek ships it: ``w = fp8 * scale_inv`` tile by tile.

- Dense linears stored as block-FP8 stay FP8: a ``Linear`` over a ``QuantizedWeight``
  (``fp8_block128``; ``fp8_block128_ue8m0`` where config.json's ``quantization_config`` says
  ``scale_fmt: ue8m0`` and every scale of the weight is a power of two, as DeepSeek-V3.1 and
  later store them: the same values, and dense.linear_a8w8 then rounds the activations' scales
  up to powers of two as DeepSeek's inference code does), computed by the engine's
  ``dense.linear`` op (``dense.linear_a8w8`` with ``--linear-activation-dtype fp8``) once
  ``linears.bind_linears`` has given it the resolved ops (a decode step then reads one byte per
  weight, not two). Other dense linears are kept in the compute dtype and are plain torch
  products; the indexer's ``weights_proj`` in fp32 (block-FP8 or not).
- MLA's ``kv_b_proj`` is split into the absorbed ``W_UK [H, nope, 512]`` and ``W_UV [H, v, 512]``
  (decode and prefill both attend in the 576-wide latent space).
- Routed and shared experts become ``QuantizedWeight``s for ``moe.experts``: block-FP8 stays
  FP8; bf16 stays bf16; fp32 is rounded to bf16 (``moe.experts`` has no fp32 weight format).

Every expected tensor is checked (present, shape) before any is read; all problems are raised
at once. Tensors the graph does not use (an MTP layer past ``num_hidden_layers``) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hwrun.checkpoint.safetensors_reader import CheckpointError, SafetensorsCheckpoint
from hwrun.engine.linears import Fp32Linear, FusedLinear, Linear
from hwrun.engine.model_config import LATENT_RANK, ROPE_DIM, ModelConfig
from hwrun.formats.e8m0 import decode_e8m0, encode_e8m0
from hwrun.formats.fp8 import dequantize_fp8_block128
from hwrun.ops.indexer import INDEX_HEAD_DIM
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight, stack_shared_group


@dataclass(frozen=True, eq=False)
class IndexerWeights:
    wq_b: Linear  # [Hi * 128, q_lora]
    wk: Linear  # [128, hidden]
    k_norm_weight: torch.Tensor  # [128] LayerNorm
    k_norm_bias: torch.Tensor  # [128]
    weights_proj: Fp32Linear  # [Hi, hidden], an fp32 product (transformers keeps it in fp32)


@dataclass(frozen=True, eq=False)
class AttentionWeights:
    q_a_proj: Linear  # [q_lora, hidden]
    q_a_norm: torch.Tensor  # [q_lora]
    q_b_proj: Linear  # [H * (nope + 64), q_lora]
    kv_a_proj: Linear  # [512 + 64, hidden]
    kv_a_norm: torch.Tensor  # [512]
    w_uk: torch.Tensor  # [H, nope, 512]: q_nope -> latent query
    w_uv: torch.Tensor  # [H, v, 512]: latent output -> value head
    o_proj: Linear  # [hidden, H * v]
    indexer: IndexerWeights
    # q_a, the indexer's wk and kv_a (all read x, in this order), and q_b with the indexer's
    # wq_b (both read q_a's norm), each as one product when fuse_projections could join them;
    # None: separate.
    from_hidden: FusedLinear | None = None
    from_q_lora: FusedLinear | None = None


@dataclass(frozen=True, eq=False)
class DenseMLPWeights:
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear


@dataclass(frozen=True, eq=False)
class MoEWeights:
    router: Fp32Linear  # [E, hidden], an fp32 product
    correction_bias: torch.Tensor | None  # [E] fp32
    w13: QuantizedWeight  # [E, 2I, hidden]
    w2: QuantizedWeight  # [E, hidden, I]
    shared: tuple[QuantizedWeight, QuantizedWeight] | None  # [2Is, hidden], [hidden, Is]


@dataclass(frozen=True, eq=False)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    post_attention_norm: torch.Tensor  # [hidden]
    attention: AttentionWeights
    mlp: DenseMLPWeights | MoEWeights


@dataclass(frozen=True, eq=False)
class ModelWeights:
    embed: torch.Tensor  # [V, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: Linear  # [V, hidden]


def tensor_bytes(obj: object) -> int:
    """Bytes held by the tensors of a weights object (dataclasses, tuples, QuantizedWeights)."""
    if obj is None or isinstance(obj, FusedLinear):
        return 0  # a fused product's bytes are its projections', which are views into it
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, QuantizedWeight):
        return obj.nbytes
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(item) for item in obj)
    return sum(tensor_bytes(getattr(obj, f)) for f in getattr(obj, "__dataclass_fields__", {}))


class _Loader:
    def __init__(self, path: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype):
        self.checkpoint = SafetensorsCheckpoint(path)
        self.config, self.device, self.dtype = config, device, dtype
        self.problems: list[str] = []

    def expect(self, name: str, shape: tuple[int, ...]) -> None:
        entry = self.checkpoint.entries.get(name)
        if entry is None:
            self.problems.append(f"{name}: missing (expected {list(shape)})")
        elif entry.shape != shape:
            self.problems.append(f"{name}: shape {list(entry.shape)}, expected {list(shape)}")
        elif entry.dtype == "F8_E4M3":
            scale_name = name.removesuffix("weight") + "weight_scale_inv"
            tiles = (-(-shape[0] // FP8_BLOCK), -(-shape[1] // FP8_BLOCK))
            scale = self.checkpoint.entries.get(scale_name)
            if scale is None or scale.shape != tiles or scale.dtype != "F32":
                got = "missing" if scale is None else f"{scale.dtype} {list(scale.shape)}"
                self.problems.append(
                    f"{scale_name}: an FP8 weight needs fp32 block scales {list(tiles)}, got {got}"
                )

    def is_fp8(self, name: str) -> bool:
        return self.checkpoint.entries[name].dtype == "F8_E4M3"

    def dense(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A tensor in ``dtype`` (default the compute dtype); block-FP8 decoded."""
        dtype = dtype or self.dtype
        raw = self.checkpoint.read(name, self.device)
        if raw.dtype == torch.float8_e4m3fn:
            scales = self.checkpoint.read(
                name.removesuffix("weight") + "weight_scale_inv", self.device
            )
            return dequantize_fp8_block128(raw.view(torch.uint8), scales).to(dtype)
        return raw.to(dtype)

    def linear(self, name: str, dtype: torch.dtype | None = None) -> Linear:
        """A block-FP8 weight as stored (fp8_block128), unless ``dtype`` asks for another;
        anything else in ``dtype`` (default the compute dtype)."""
        if dtype is None and self.is_fp8(name):
            weight = self.quantized([name], name)
            codes = _e8m0_exactly(weight.scales) if self.config.fp8_scale_fmt == "ue8m0" else None
            if codes is not None:
                weight = QuantizedWeight(
                    "fp8_block128_ue8m0", weight.shape, weight.data, codes, name=weight.name
                )
            return Linear(weight)
        return Linear(self.dense(name, dtype))

    def quantized(self, names: list[str], label: str) -> QuantizedWeight:
        """Weights stacked along rows (e.g. gate then up) as one QuantizedWeight."""
        if all(self.is_fp8(n) for n in names):
            codes = [self.checkpoint.read(n, self.device).view(torch.uint8) for n in names]
            scales = [
                self.checkpoint.read(n.removesuffix("weight") + "weight_scale_inv", self.device)
                for n in names
            ]
            data, scale = torch.cat(codes), torch.cat(scales)
            return QuantizedWeight("fp8_block128", tuple(data.shape), data, scale, name=label)
        if any(self.is_fp8(n) for n in names):
            raise CheckpointError(f"{label}: mixes FP8 and non-FP8 parts ({names})")
        data = torch.cat([self.checkpoint.read(n, self.device) for n in names])
        return QuantizedWeight("bf16", tuple(data.shape), data.to(torch.bfloat16), name=label)

    def fused_experts(self, name: str) -> QuantizedWeight:
        """A fused ``[E, R, C]`` expert tensor (transformers 5's layout), as bf16."""
        if self.is_fp8(name):
            raise CheckpointError(f"{name}: fused FP8 experts (without per-expert scales) unknown")
        data = self.checkpoint.read(name, self.device).to(torch.bfloat16)
        return QuantizedWeight("bf16", tuple(data.shape), data, name=name)

    def experts(self, names: list[list[str]], label: str) -> QuantizedWeight:
        """Per-expert weights ``names[e]`` stacked into one ``[E, R, C]`` QuantizedWeight."""
        per_expert = [self.quantized(parts, f"{label}[{e}]") for e, parts in enumerate(names)]
        first = per_expert[0]
        data = torch.stack([w.data for w in per_expert])
        scales = None if first.scales is None else torch.stack([w.scales for w in per_expert])
        return QuantizedWeight(
            first.format, (len(per_expert), *first.shape), data, scales, name=label
        )


def _fused_experts(checkpoint: SafetensorsCheckpoint, layer: int) -> bool:
    return f"model.layers.{layer}.mlp.experts.gate_up_proj" in checkpoint


def _expected(config: ModelConfig, checkpoint: SafetensorsCheckpoint) -> dict[str, tuple[int, ...]]:
    """Every tensor name the graph reads, with its logical shape."""
    c = config
    hidden, heads = c.hidden_size, c.num_heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, hidden)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            a + "q_a_proj.weight": (c.q_lora_rank, hidden),
            a + "q_a_layernorm.weight": (c.q_lora_rank,),
            a + "q_b_proj.weight": (heads * c.qk_head_dim, c.q_lora_rank),
            a + "kv_a_proj_with_mqa.weight": (LATENT_RANK + ROPE_DIM, hidden),
            a + "kv_a_layernorm.weight": (LATENT_RANK,),
            a + "kv_b_proj.weight": (heads * (c.qk_nope_head_dim + c.v_head_dim), LATENT_RANK),
            a + "o_proj.weight": (hidden, heads * c.v_head_dim),
            a + "indexer.wq_b.weight": (c.index_n_heads * INDEX_HEAD_DIM, c.q_lora_rank),
            a + "indexer.wk.weight": (INDEX_HEAD_DIM, hidden),
            a + "indexer.k_norm.weight": (INDEX_HEAD_DIM,),
            a + "indexer.k_norm.bias": (INDEX_HEAD_DIM,),
            a + "indexer.weights_proj.weight": (c.index_n_heads, hidden),
        }
        m = p + "mlp."
        if not c.moe_layers[i]:
            inter = c.intermediate_size
            shapes |= {
                m + "gate_proj.weight": (inter, hidden),
                m + "up_proj.weight": (inter, hidden),
                m + "down_proj.weight": (hidden, inter),
            }
            continue
        inter = c.moe_intermediate_size
        shapes[m + "gate.weight"] = (c.n_routed_experts, hidden)
        if _fused_experts(checkpoint, i):
            shapes[m + "experts.gate_up_proj"] = (c.n_routed_experts, 2 * inter, hidden)
            shapes[m + "experts.down_proj"] = (c.n_routed_experts, hidden, inter)
        for e in range(0 if _fused_experts(checkpoint, i) else c.n_routed_experts):
            shapes |= {
                f"{m}experts.{e}.gate_proj.weight": (inter, hidden),
                f"{m}experts.{e}.up_proj.weight": (inter, hidden),
                f"{m}experts.{e}.down_proj.weight": (hidden, inter),
            }
        if c.n_shared_experts:
            shared = inter * c.n_shared_experts
            shapes |= {
                m + "shared_experts.gate_proj.weight": (shared, hidden),
                m + "shared_experts.up_proj.weight": (shared, hidden),
                m + "shared_experts.down_proj.weight": (hidden, shared),
            }
    return shapes


def load_weights(
    path: str | Path, config: ModelConfig, device: torch.device | str, dtype: torch.dtype
) -> ModelWeights:
    """Load the checkpoint at ``path`` for ``config`` onto ``device``; linears in ``dtype``.

    :raises CheckpointError: listing every missing or mis-shaped tensor, before reading data.
    """
    loader = _Loader(Path(path), config, torch.device(device), dtype)
    expected = _expected(config, loader.checkpoint)
    for name, shape in expected.items():
        loader.expect(name, shape)
    fp8_experts = [n for n in expected if ".experts." in n and loader.checkpoint.entries.get(n)]
    if config.moe_intermediate_size % FP8_BLOCK and any(loader.is_fp8(n) for n in fp8_experts):
        loader.problems.append(
            f"FP8 experts need moe_intermediate_size to be a multiple of {FP8_BLOCK} (gate and "
            f"up tiles stack into one w13), got {config.moe_intermediate_size}"
        )
    if loader.problems:
        raise CheckpointError.listing(
            f"checkpoint {path} does not fit its config.json", loader.problems
        )
    layers = tuple(_load_layer(loader, i) for i in range(config.num_layers))
    embed = loader.dense("model.embed_tokens.weight")
    head = embed if config.tie_word_embeddings else loader.dense("lm_head.weight")
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=loader.dense("model.norm.weight"),
        lm_head=Linear(head),
    )


def _e8m0_exactly(scales: torch.Tensor) -> torch.Tensor | None:
    """The e8m0 codes of fp32 ``scales`` when they hold every scale exactly (each a power of
    two e8m0 reaches), else None."""
    try:
        codes = encode_e8m0(scales.float().contiguous())
    except ValueError:  # a scale that is not a power of two
        return None
    return codes if torch.equal(decode_e8m0(codes), scales.float()) else None


def _load_layer(loader: _Loader, index: int) -> LayerWeights:
    c = loader.config
    p = f"model.layers.{index}."
    a = p + "self_attn."
    kv_b = loader.dense(a + "kv_b_proj.weight").view(
        c.num_heads, c.qk_nope_head_dim + c.v_head_dim, LATENT_RANK
    )
    indexer = IndexerWeights(
        wq_b=loader.linear(a + "indexer.wq_b.weight"),
        wk=loader.linear(a + "indexer.wk.weight"),
        k_norm_weight=loader.dense(a + "indexer.k_norm.weight"),
        k_norm_bias=loader.dense(a + "indexer.k_norm.bias"),
        weights_proj=Fp32Linear.load(
            loader.dense(a + "indexer.weights_proj.weight", torch.float32)
        ),
    )
    attention = AttentionWeights(
        q_a_proj=loader.linear(a + "q_a_proj.weight"),
        q_a_norm=loader.dense(a + "q_a_layernorm.weight"),
        q_b_proj=loader.linear(a + "q_b_proj.weight"),
        kv_a_proj=loader.linear(a + "kv_a_proj_with_mqa.weight"),
        kv_a_norm=loader.dense(a + "kv_a_layernorm.weight"),
        w_uk=kv_b[:, : c.qk_nope_head_dim].contiguous(),
        w_uv=kv_b[:, c.qk_nope_head_dim :].contiguous(),
        o_proj=loader.linear(a + "o_proj.weight"),
        indexer=indexer,
    )
    m = p + "mlp."
    mlp: DenseMLPWeights | MoEWeights
    if not c.moe_layers[index]:
        mlp = DenseMLPWeights(
            gate_proj=loader.linear(m + "gate_proj.weight"),
            up_proj=loader.linear(m + "up_proj.weight"),
            down_proj=loader.linear(m + "down_proj.weight"),
        )
    else:
        experts = range(c.n_routed_experts)
        bias_name = m + "gate.e_score_correction_bias"
        shared = None
        if c.n_shared_experts:
            s = m + "shared_experts."
            shared = (
                loader.quantized([s + "gate_proj.weight", s + "up_proj.weight"], s + "w13"),
                loader.quantized([s + "down_proj.weight"], s + "w2"),
            )
        w13 = (
            loader.fused_experts(m + "experts.gate_up_proj")
            if _fused_experts(loader.checkpoint, index)
            else loader.experts(
                [
                    [f"{m}experts.{e}.gate_proj.weight", f"{m}experts.{e}.up_proj.weight"]
                    for e in experts
                ],
                m + "w13",
            )
        )
        w2 = (
            loader.fused_experts(m + "experts.down_proj")
            if _fused_experts(loader.checkpoint, index)
            else loader.experts([[f"{m}experts.{e}.down_proj.weight"] for e in experts], m + "w2")
        )
        w13, w2, shared = _shared_as_group_e(w13, w2, shared)
        mlp = MoEWeights(
            router=Fp32Linear.load(loader.dense(m + "gate.weight", torch.float32)),
            correction_bias=(
                loader.dense(bias_name, torch.float32) if bias_name in loader.checkpoint else None
            ),
            w13=w13,
            w2=w2,
            shared=shared,
        )
    return LayerWeights(
        input_norm=loader.dense(p + "input_layernorm.weight"),
        post_attention_norm=loader.dense(p + "post_attention_layernorm.weight"),
        attention=attention,
        mlp=mlp,
    )


def _shared_as_group_e(
    w13: QuantizedWeight,
    w2: QuantizedWeight,
    shared: tuple[QuantizedWeight, QuantizedWeight] | None,
) -> tuple[QuantizedWeight, QuantizedWeight, tuple[QuantizedWeight, QuantizedWeight] | None]:
    """A shared expert of the routed experts' shape and format stored as group E of their
    tensors (views; same values, the same bytes in all), so that the Triton MoE reads every
    group's codes through one tensor descriptor per weight (kernels/triton/moe.py,
    ``TileConfig.host_descriptors``); other shared experts as they are."""
    if shared is None or any(
        w.format != r.format or w.shape != r.shape[1:] or w.tensor_scale is not None
        for w, r in zip(shared, (w13, w2), strict=True)
    ):
        return w13, w2, shared
    w13, shared13 = stack_shared_group(w13, shared[0])
    w2, shared2 = stack_shared_group(w2, shared[1])
    return w13, w2, (shared13, shared2)


def expert_a8w8_reasons(weights: ModelWeights) -> list[str]:
    """Why the experts cannot take e4m3 activations (``moe.experts``' a8w8 mode: block-FP8
    weights, the shared experts' too, with both matrix sizes multiples of 128); none: ``[]``."""
    from hwrun.ops.moe_experts import ACTIVATION_MODES

    formats, group = ACTIVATION_MODES["a8w8"]
    reasons = []
    for index, layer in enumerate(weights.layers):
        if not isinstance(layer.mlp, MoEWeights):
            continue
        mlp = layer.mlp
        for weight in (mlp.w13, mlp.w2, *(mlp.shared or ())):
            if weight.format not in formats:
                reasons.append(
                    f"layer {index}: {weight.name} is {weight.format}; fp8 expert activations "
                    f"need {'/'.join(formats)} experts (use --expert-activation-dtype bf16)"
                )
            elif any(size % group for size in weight.shape[-2:]):
                reasons.append(
                    f"layer {index}: {weight.name} {list(weight.shape)} is not in whole groups of "
                    f"{group} (a tensor-parallel split may have cut them)"
                )
    if not reasons and not any(isinstance(layer.mlp, MoEWeights) for layer in weights.layers):
        reasons.append("the model has no MoE layers: --expert-activation-dtype fp8 changes nothing")
    return reasons
