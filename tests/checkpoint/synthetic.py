"""A small DeepSeek-style FP8 checkpoint written with the safetensors library."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from hwrun.checkpoint.moe_names import MoECheckpointConfig
from hwrun.ops.quantized_weight import QuantizedWeight, quantize_weight

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def fp8_tensors(name: str, weight: QuantizedWeight) -> dict[str, torch.Tensor]:
    return {
        f"{name}.weight": weight.data.view(torch.float8_e4m3fn),
        f"{name}.weight_scale_inv": weight.scales,
    }


def write_checkpoint(
    directory: Path, config: MoECheckpointConfig, shared_fp8: bool = False, files: int = 2
) -> dict[str, QuantizedWeight | torch.Tensor]:
    """Write the MoE layers of ``config`` (plus a dense tensor the MoE loader must ignore) over
    ``files`` files, a layer's tensors never split; return what was written, by tensor name
    (FP8 weights as the QuantizedWeight they came from)."""
    generator = torch.Generator().manual_seed(0)
    hidden, inter = config.hidden_size, config.moe_intermediate_size
    written: dict[str, QuantizedWeight | torch.Tensor] = {}
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(files)]
    shards[0]["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(4, hidden).bfloat16()
    for index, layer in enumerate(config.moe_layers):
        shard = shards[index % files]
        router = torch.randn(config.num_experts, hidden, generator=generator)
        bias = torch.randn(config.num_experts, generator=generator) * 0.1
        shard[config.router_name(layer, "weight")] = router
        shard[config.router_name(layer, "e_score_correction_bias")] = bias
        written[config.router_name(layer, "weight")] = router
        written[config.router_name(layer, "e_score_correction_bias")] = bias
        for expert in range(config.num_experts):
            for proj in PROJECTIONS:
                shape = (hidden, inter) if proj == "down_proj" else (inter, hidden)
                w = torch.randn(shape, generator=generator) * 0.02
                name = f"{config.experts_prefix(layer)}.{expert}.{proj}"
                written[name] = quantize_weight(w, "fp8_block128", name)
                shard.update(fp8_tensors(name, written[name]))
        if not config.shared_intermediate_size:
            continue
        for proj in PROJECTIONS:
            shared = config.shared_intermediate_size
            shape = (hidden, shared) if proj == "down_proj" else (shared, hidden)
            w = torch.randn(shape, generator=generator) * 0.02
            name = f"{config.shared_prefix(layer)}.{proj}"
            if shared_fp8:
                written[name] = quantize_weight(w, "fp8_block128", name)
                shard.update(fp8_tensors(name, written[name]))
            else:
                written[name] = w.bfloat16()
                shard[f"{name}.weight"] = written[name]
    directory.mkdir(parents=True, exist_ok=True)
    for index, shard in enumerate(shards):
        save_file(shard, directory / f"model-{index + 1:05d}-of-{files:05d}.safetensors")
    return written
