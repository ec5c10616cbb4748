"""Streaming loader of a checkpoint's MoE layers, re-quantizing FP8 experts to MXFP4 on the way.

The seeds' ROCm path (``VLLM_FP8_MOE_REQUANT=mxfp4``): the checkpoint keeps block-FP8 experts;
the loader materializes one layer at a time, re-quantizes every expert of it to MXFP4 and frees
the layer's FP8 copy before the next, so peak memory is the MXFP4 model plus one layer's FP8
experts (plus one expert matrix being converted). That is what lets a 1T model fit four GPUs.

Order of work, so that a bad checkpoint never yields a half-loaded model:
1. every expected tensor's presence, dtype and shape is checked from the file headers alone
   (no data read) and all problems are raised at once, each naming the tensor and the
   expected dtype and shape;
2. layers are then read and converted one by one; the result is returned only when all are.

Tensor names follow DeepSeek-V3's Hugging Face checkpoints (per-expert ``gate_proj``,
``up_proj``, ``down_proj`` with ``weight_scale_inv`` fp32 block scales; ``mlp.gate.weight`` the
router; ``mlp.gate.e_score_correction_bias``; ``mlp.shared_experts``). Only the MoE tensors are
this loader's; attention and the rest belong to the model's own loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hwrun.checkpoint.moe_names import (
    EXPERT_PROJECTIONS,
    MoECheckpointConfig,
    TensorSpec,
    expected_tensors,
)
from hwrun.checkpoint.safetensors_reader import CheckpointError, SafetensorsCheckpoint
from hwrun.ops.moe_requant import requant_matrix_to_mxfp4
from hwrun.ops.quantized_weight import QuantizedWeight

EXPERT_TARGETS: tuple[str, ...] = ("mxfp4", "fp8_block128")


@dataclass(frozen=True, eq=False)
class MoELayerWeights:
    """One layer's MoE weights, in the shapes ``moe.route`` and ``moe.experts`` take."""

    router_weight: torch.Tensor  # [E, D] as stored (logits = x @ router_weight.T in fp32)
    e_score_correction_bias: torch.Tensor | None  # [E] fp32
    w13: QuantizedWeight  # [E, 2I, D]
    w2: QuantizedWeight  # [E, D, I]
    shared_experts: tuple[QuantizedWeight, QuantizedWeight] | None  # [2Is, D], [D, Is]

    @property
    def nbytes(self) -> int:
        parts = [self.router_weight, self.e_score_correction_bias]
        tensors = sum(t.numel() * t.element_size() for t in parts if t is not None)
        weights = [self.w13, self.w2, *(self.shared_experts or ())]
        return tensors + sum(w.nbytes for w in weights)


@dataclass(frozen=True, eq=False)
class MoEModelWeights:
    """Every MoE layer of a checkpoint, by layer index."""

    layers: dict[int, MoELayerWeights]

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers.values())


def load_moe_layers(
    path: str | Path,
    config: MoECheckpointConfig,
    expert_format: str = "mxfp4",
    rule: str = "floor",
    device: str | torch.device = "cpu",
) -> MoEModelWeights:
    """Load the MoE layers of the checkpoint at ``path`` (a file or a directory of files).

    ``expert_format="mxfp4"`` re-quantizes the routed experts layer by layer (``rule`` is the
    mxfp4 scale rule); ``"fp8_block128"`` keeps them as stored (then I must be a multiple of
    128 so gate and up tiles stack into one w13). Shared experts and the router keep the
    checkpoint's precision. Everything is placed on ``device``; the FP8 layer is converted
    there, so the peak bound holds for that device's memory.

    :raises CheckpointError: listing every missing or mis-shaped tensor, before reading data.
    """
    if expert_format not in EXPERT_TARGETS:
        raise CheckpointError(
            f"expert_format must be one of {list(EXPERT_TARGETS)}, got {expert_format!r}"
        )
    checkpoint = SafetensorsCheckpoint(path)
    plan = expected_tensors(
        config, lambda name: getattr(checkpoint.entries.get(name), "dtype", None)
    )
    _check_plan(checkpoint, plan, config, expert_format)
    layers = {}
    for layer in config.moe_layers:
        layers[layer] = _load_layer(
            lambda name: checkpoint.read(name, device), config, layer, expert_format, rule
        )
    return MoEModelWeights(layers)


def _check_plan(
    checkpoint: SafetensorsCheckpoint,
    plan: list[TensorSpec],
    config: MoECheckpointConfig,
    expert_format: str,
) -> None:
    """Raise every problem at once: the config's own first, then each tensor's."""
    problems = _config_problems(checkpoint, config, expert_format)
    for spec in plan:
        entry = checkpoint.entries.get(spec.name)
        want = f"{'/'.join(spec.dtypes)} {list(spec.shape)}"
        if entry is None:
            if spec.required:
                problems.append(f"{spec.name}: missing (expected {want})")
        elif entry.dtype not in spec.dtypes or entry.shape != spec.shape:
            problems.append(f"{spec.name}: expected {want}, got {entry.dtype} {list(entry.shape)}")
    if problems:
        raise CheckpointError.listing("checkpoint does not match the MoE config", problems)


def _config_problems(
    checkpoint: SafetensorsCheckpoint, config: MoECheckpointConfig, expert_format: str
) -> list[str]:
    problems = []
    if expert_format == "fp8_block128" and config.moe_intermediate_size % 128:
        problems.append(
            f"expert_format 'fp8_block128' stacks gate and up 128x128 tiles into w13, so "
            f"moe_intermediate_size must be a multiple of 128, got {config.moe_intermediate_size}"
            "; load with expert_format='mxfp4'"
        )
    if expert_format == "mxfp4" and (config.hidden_size % 32 or config.moe_intermediate_size % 32):
        problems.append(
            f"mxfp4 experts need hidden_size ({config.hidden_size}) and moe_intermediate_size "
            f"({config.moe_intermediate_size}) to be multiples of 32"
        )
    for layer in config.moe_layers:
        name = config.shared_name(layer, "gate_proj", "weight")
        entry = checkpoint.entries.get(name)
        if entry is not None and entry.dtype == "F8_E4M3" and config.shared_intermediate_size % 128:
            problems.append(
                f"{name}: FP8 shared experts are kept as fp8_block128, which stacks gate and up "
                f"tiles, so the shared intermediate size must be a multiple of 128, got "
                f"{config.shared_intermediate_size}"
            )
    return problems


def _load_layer(
    read: Callable[[str], torch.Tensor],
    config: MoECheckpointConfig,
    layer: int,
    expert_format: str,
    rule: str,
) -> MoELayerWeights:
    # The layer's FP8 experts: materialized together, each expert's copy dropped once converted.
    fp8 = {
        (expert, proj, part): read(config.expert_name(layer, expert, proj, part))
        for expert in range(config.num_experts)
        for proj in EXPERT_PROJECTIONS
        for part in ("weight", "weight_scale_inv")
    }
    if expert_format == "mxfp4":
        w13, w2 = _requant_layer(fp8, config, layer, rule)
    else:
        w13, w2 = _stack_fp8_layer(fp8, config, layer)
    del fp8

    bias = None
    if config.has_correction_bias:
        bias = read(config.router_name(layer, "e_score_correction_bias"))
    shared = None
    if config.shared_intermediate_size:
        shared = _read_shared(read, config, layer)
    return MoELayerWeights(
        router_weight=read(config.router_name(layer, "weight")),
        e_score_correction_bias=bias,
        w13=w13,
        w2=w2,
        shared_experts=shared,
    )


def _codes(tensor: torch.Tensor) -> torch.Tensor:
    """E4M3 codes as the formats take them: torch's float8_e4m3fn bytes are OCP e4m3 bytes."""
    return tensor.view(torch.uint8)


def _requant_layer(
    fp8: dict, config: MoECheckpointConfig, layer: int, rule: str
) -> tuple[QuantizedWeight, QuantizedWeight]:
    num_experts, hidden, inter = (
        config.num_experts,
        config.hidden_size,
        config.moe_intermediate_size,
    )
    device = fp8[(0, "gate_proj", "weight")].device
    w13_packed = torch.empty(num_experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=device)
    w13_scales = torch.empty(num_experts, 2 * inter, hidden // 32, dtype=torch.uint8, device=device)
    w2_packed = torch.empty(num_experts, hidden, inter // 2, dtype=torch.uint8, device=device)
    w2_scales = torch.empty(num_experts, hidden, inter // 32, dtype=torch.uint8, device=device)
    targets = {
        "gate_proj": (w13_packed[:, :inter], w13_scales[:, :inter]),
        "up_proj": (w13_packed[:, inter:], w13_scales[:, inter:]),
        "down_proj": (w2_packed, w2_scales),
    }
    for expert in range(num_experts):
        for proj, (packed, scales) in targets.items():
            codes = _codes(fp8.pop((expert, proj, "weight")))
            block_scales = fp8.pop((expert, proj, "weight_scale_inv"))
            packed[expert], scales[expert] = requant_matrix_to_mxfp4(codes, block_scales, rule)
            del codes, block_scales
    prefix = config.experts_prefix(layer)
    return (
        QuantizedWeight(
            "mxfp4", (num_experts, 2 * inter, hidden), w13_packed, w13_scales, name=f"{prefix}.w13"
        ),
        QuantizedWeight(
            "mxfp4", (num_experts, hidden, inter), w2_packed, w2_scales, name=f"{prefix}.w2"
        ),
    )


def _stack_fp8_layer(
    fp8: dict, config: MoECheckpointConfig, layer: int
) -> tuple[QuantizedWeight, QuantizedWeight]:
    def take(expert: int, proj: str, part: str) -> torch.Tensor:
        tensor = fp8.pop((expert, proj, part))
        return _codes(tensor) if part == "weight" else tensor

    def stacked(projs: tuple[str, ...], part: str) -> torch.Tensor:  # [E, rows, cols]
        per_expert = [
            torch.cat([take(e, p, part) for p in projs]) for e in range(config.num_experts)
        ]
        return torch.stack(per_expert)

    prefix = config.experts_prefix(layer)
    gate_up = ("gate_proj", "up_proj")
    w13 = QuantizedWeight(
        "fp8_block128",
        (config.num_experts, 2 * config.moe_intermediate_size, config.hidden_size),
        stacked(gate_up, "weight"),
        stacked(gate_up, "weight_scale_inv"),
        name=f"{prefix}.w13",
    )
    w2 = QuantizedWeight(
        "fp8_block128",
        (config.num_experts, config.hidden_size, config.moe_intermediate_size),
        stacked(("down_proj",), "weight"),
        stacked(("down_proj",), "weight_scale_inv"),
        name=f"{prefix}.w2",
    )
    return w13, w2


def _read_shared(
    read: Callable[[str], torch.Tensor], config: MoECheckpointConfig, layer: int
) -> tuple[QuantizedWeight, QuantizedWeight]:
    def weight(projs: tuple[str, ...], shape: tuple[int, int], label: str) -> QuantizedWeight:
        name = f"{config.shared_prefix(layer)}.{label}"
        tensors = [read(config.shared_name(layer, p, "weight")) for p in projs]
        if tensors[0].dtype != torch.float8_e4m3fn:
            return QuantizedWeight("bf16", shape, torch.cat(tensors).to(torch.bfloat16), name=name)
        scales = [read(config.shared_name(layer, p, "weight_scale_inv")) for p in projs]
        codes = torch.cat([_codes(t) for t in tensors])
        return QuantizedWeight("fp8_block128", shape, codes, torch.cat(scales), name=name)

    hidden, inter = config.hidden_size, config.shared_intermediate_size
    return (
        weight(("gate_proj", "up_proj"), (2 * inter, hidden), "w13"),
        weight(("down_proj",), (hidden, inter), "w2"),
    )
