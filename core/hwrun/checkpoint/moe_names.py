"""What a checkpoint's MoE layers hold: tensor names (DeepSeek-V3 Hugging Face naming), dtypes
and shapes, derived from the model's MoE config so a loader can check a checkpoint up front."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXPERT_PROJECTIONS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
FP8_BLOCK = 128


@dataclass(frozen=True)
class MoECheckpointConfig:
    """The MoE shape of a model, as its ``config.json`` states it.

    ``shared_intermediate_size`` is the shared experts' fused width (``n_shared_experts *
    moe_intermediate_size`` in DeepSeek's configs); 0 means no shared experts.
    """

    moe_layers: tuple[int, ...]
    num_experts: int  # E
    hidden_size: int  # D
    moe_intermediate_size: int  # I
    shared_intermediate_size: int = 0
    has_correction_bias: bool = True
    layer_prefix: str = "model.layers"

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> MoECheckpointConfig:
        """From a DeepSeek-V3-style ``config.json``: MoE layers start at
        ``first_k_dense_replace`` and repeat every ``moe_layer_freq`` layers."""
        first, every = hf.get("first_k_dense_replace", 0), hf.get("moe_layer_freq", 1)
        layers = tuple(
            i for i in range(hf["num_hidden_layers"]) if i >= first and (i - first) % every == 0
        )
        return cls(
            moe_layers=layers,
            num_experts=hf["n_routed_experts"],
            hidden_size=hf["hidden_size"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            shared_intermediate_size=hf.get("n_shared_experts", 0) * hf["moe_intermediate_size"],
            has_correction_bias=hf.get("topk_method", "noaux_tc") == "noaux_tc",
        )

    def experts_prefix(self, layer: int) -> str:
        return f"{self.layer_prefix}.{layer}.mlp.experts"

    def expert_name(self, layer: int, expert: int, proj: str, part: str) -> str:
        return f"{self.experts_prefix(layer)}.{expert}.{proj}.{part}"

    def router_name(self, layer: int, part: str) -> str:
        return f"{self.layer_prefix}.{layer}.mlp.gate.{part}"

    def shared_prefix(self, layer: int) -> str:
        return f"{self.layer_prefix}.{layer}.mlp.shared_experts"

    def shared_name(self, layer: int, proj: str, part: str) -> str:
        return f"{self.shared_prefix(layer)}.{proj}.{part}"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor a checkpoint must (or may) hold."""

    name: str
    dtypes: tuple[str, ...]  # safetensors dtype names accepted
    shape: tuple[int, ...]
    required: bool = True


def _scale_shape(rows: int, cols: int) -> tuple[int, int]:
    return (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))


def _projection_shape(proj: str, hidden: int, inter: int) -> tuple[int, int]:
    return (hidden, inter) if proj == "down_proj" else (inter, hidden)


def expected_tensors(
    config: MoECheckpointConfig,
    stored_dtype: Callable[[str], str | None],
) -> list[TensorSpec]:
    """Every MoE tensor of every MoE layer. ``stored_dtype(name)`` (None when absent) decides
    whether a shared-expert weight needs its FP8 block scales."""
    hidden, inter = config.hidden_size, config.moe_intermediate_size
    specs = []
    for layer in config.moe_layers:
        specs.append(
            TensorSpec(
                config.router_name(layer, "weight"), ("F32", "BF16"), (config.num_experts, hidden)
            )
        )
        if config.has_correction_bias:
            specs.append(
                TensorSpec(
                    config.router_name(layer, "e_score_correction_bias"),
                    ("F32",),
                    (config.num_experts,),
                )
            )
        for expert in range(config.num_experts):
            for proj in EXPERT_PROJECTIONS:
                shape = _projection_shape(proj, hidden, inter)
                specs.append(
                    TensorSpec(
                        config.expert_name(layer, expert, proj, "weight"), ("F8_E4M3",), shape
                    )
                )
                specs.append(
                    TensorSpec(
                        config.expert_name(layer, expert, proj, "weight_scale_inv"),
                        ("F32",),
                        _scale_shape(*shape),
                    )
                )
        if not config.shared_intermediate_size:
            continue
        for proj in EXPERT_PROJECTIONS:
            shape = _projection_shape(proj, hidden, config.shared_intermediate_size)
            name = config.shared_name(layer, proj, "weight")
            specs.append(TensorSpec(name, ("BF16", "F32", "F8_E4M3"), shape))
            if stored_dtype(name) == "F8_E4M3":
                specs.append(
                    TensorSpec(
                        config.shared_name(layer, proj, "weight_scale_inv"),
                        ("F32",),
                        _scale_shape(*shape),
                    )
                )
    return specs
