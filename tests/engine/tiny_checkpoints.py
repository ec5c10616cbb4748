"""Tiny random DeepseekV32 checkpoints written by transformers, and transformers' fp32 forward
of the same weights as the engine's oracle.

Weights are drawn, rounded to bf16 (so the bf16 checkpoint holds them exactly) and saved with
``save_pretrained``. The block-FP8 variant quantizes every projection weight with torch's own
float8_e4m3fn cast (one fp32 ``weight_scale_inv`` per 128x128 tile, amax / 448, as DeepSeek
ships them): an encoder independent of hwrun's; the oracle then runs on the decoded values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

FP8_MAX = 448.0
TILE = 128


@dataclass(frozen=True)
class TinyModel:
    path: Path
    oracle: DeepseekV32ForCausalLM  # fp32, eager attention, same weights as the checkpoint
    config: DeepseekV32Config


def tiny_config(**overrides) -> DeepseekV32Config:
    fields = dict(
        vocab_size=128,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        index_n_heads=8,
        index_head_dim=128,
        index_topk=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        intermediate_size=64,
        moe_intermediate_size=32,
        n_routed_experts=8,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        max_position_embeddings=512,
        eos_token_id=1,
        bos_token_id=0,
    )
    fields.update(overrides)
    return DeepseekV32Config(**fields)


def _fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [R, C] -> (float8_e4m3fn [R, C], fp32 scale_inv [ceil(R/128), ceil(C/128)])."""
    rows, cols = w.shape
    padded = F.pad(w.float(), (0, -cols % TILE, 0, -rows % TILE))
    tiles = padded.view(padded.shape[0] // TILE, TILE, padded.shape[1] // TILE, TILE)
    scale = tiles.abs().amax(dim=(1, 3)).clamp_min(1e-12) / FP8_MAX
    codes = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return codes.view(padded.shape)[:rows, :cols].contiguous(), scale


def _is_fp8_target(name: str) -> bool:
    return name.endswith("proj.weight") and "weights_proj" not in name


def build_tiny_model(
    path: Path, seed: int = 0, weights: str = "bf16", std: float = 0.15, **overrides
) -> TinyModel:
    """Write a checkpoint to ``path``; ``weights`` "bf16" or "fp8" (block-FP8 projections)."""
    config = tiny_config(**overrides)
    torch.manual_seed(seed)
    model = DeepseekV32ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, std)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.copy_(
                    0.05 * torch.randn_like(gate.e_score_correction_bias)
                )
    model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    if weights == "fp8":
        _requantize_fp8(path)
    oracle = DeepseekV32ForCausalLM(config)
    state = {k: v.float() for k, v in _decoded_state(path).items()}
    oracle.load_state_dict(state, strict=False)
    oracle = oracle.float().eval()
    oracle.config._attn_implementation = "eager"
    return TinyModel(path, oracle, config)


def _requantize_fp8(path: Path) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    out = {}
    for name, tensor in tensors.items():
        if _is_fp8_target(name) and tensor.dim() == 2:
            codes, scale = _fp8_block(tensor)
            out[name] = codes
            out[name.removesuffix("weight") + "weight_scale_inv"] = scale
        else:
            out[name] = tensor
    save_file(out, file, metadata={"format": "pt"})


def _decoded_state(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's values: block-FP8 weights decoded tile by tile (fp32)."""
    tensors = load_file(path / "model.safetensors")
    state = {}
    for name, tensor in tensors.items():
        if name.endswith("weight_scale_inv"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale = tensors[name.removesuffix("weight") + "weight_scale_inv"]
            full = scale.repeat_interleave(TILE, 0).repeat_interleave(TILE, 1)
            tensor = tensor.float() * full[: tensor.shape[0], : tensor.shape[1]]
        state[name] = tensor
    return _fuse_experts(state)


def _fuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5 keeps experts fused (gate_up_proj [E, 2I, D], down_proj [E, D, I])."""
    fused: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        if ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            index, proj, _ = rest.split(".")
            experts.setdefault(prefix, {}).setdefault(int(index), {})[proj] = tensor
        else:
            fused[name] = tensor
    for prefix, by_index in experts.items():
        order = [by_index[e] for e in sorted(by_index)]
        fused[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([p["gate_proj"], p["up_proj"]]) for p in order]
        )
        fused[f"{prefix}.mlp.experts.down_proj"] = torch.stack([p["down_proj"] for p in order])
    return fused


class StorageRounding:
    """Stands in for transformers' cache in one full-sequence forward: returns what it is given
    rounded to bf16, at exactly the points where hwrun stores bf16 (the latent after its
    RMSNorm, the rotated latent RoPE part, the rotated index key)."""

    def update(self, k_pass, k_rot, layer_idx, kwargs=None):
        return _bf16(k_pass), _bf16(k_rot)

    def update_indexer(self, k, layer_idx):
        return _bf16(k)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def _rounded_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' DeepseekV32Experts.forward with the moe.experts contract's roundings: both
    GEMM inputs (token and SwiGLU intermediate) rounded to bf16, fp32 accumulation."""
    out = torch.zeros_like(hidden_states)
    for expert in range(self.num_experts):
        token_idx, slot = torch.where(top_k_index == expert)
        if token_idx.numel() == 0:
            continue
        gate, up = F.linear(_bf16(hidden_states[token_idx]), self.gate_up_proj[expert]).chunk(2, -1)
        y = F.linear(_bf16(self.act_fn(gate) * up), self.down_proj[expert])
        out.index_add_(0, token_idx, y * top_k_weights[token_idx, slot, None])
    return out


def _rounded_mlp_forward(self, x):
    """transformers' DeepseekV32MLP.forward (the shared experts) with the same roundings."""
    x = _bf16(x)
    return self.down_proj(_bf16(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))


def oracle_logits(model: TinyModel, token_ids: list[int], storage_rounding: bool) -> torch.Tensor:
    """transformers' fp32 teacher-forced logits [S, V] of ``token_ids``.

    With ``storage_rounding`` the forward applies hwrun's bf16 storage roundings (caches and the
    MoE GEMM inputs, see :class:`StorageRounding`), so the only remaining differences are fp32
    summation order; without it, it is transformers' forward exactly.
    """
    oracle = model.oracle
    ids = torch.tensor([token_ids])
    seq = len(token_ids)
    causal = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    patched = []
    if storage_rounding:
        for layer in oracle.model.layers:
            if hasattr(layer.mlp, "experts"):
                for module, fn in (
                    (layer.mlp.experts, _rounded_experts_forward),
                    (layer.mlp.shared_experts, _rounded_mlp_forward),
                ):
                    module.forward = fn.__get__(module)
                    patched.append(module)
    try:
        with torch.no_grad():
            out = oracle(
                input_ids=ids,
                attention_mask={"indexed_attention": causal},
                position_ids=torch.arange(seq)[None],
                cache=StorageRounding() if storage_rounding else None,
                use_cache=False,
            )
    finally:
        for module in patched:
            del module.forward
    return out.logits[0].float()
