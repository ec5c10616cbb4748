"""Write a random-weight DeepseekV32 checkpoint of real proportions, block-FP8 like DeepSeek's.

The engine benchmark needs a model whose weight bytes, head counts and expert shapes are those
of a real deployment, but that fits one H200 with room for KV. Defaults: 16 layers (the first
dense), hidden 4096, 64 MLA heads (q-LoRA 1536, NoPE 128, RoPE 64, V 128), 64 index heads with
top-2048, 64 routed experts of width 1024 (top 8 in 8 groups, 4 kept) plus one shared: about
12 B parameters, ~12.5 GB in FP8. Projections are stored as e4m3 with an fp32
``weight_scale_inv`` per 128x128 tile; norms, embeddings, the router and the LM head in bf16.
``--bf16`` writes the same values decoded to bf16 (same seed, same model), for peers that do not
read block-FP8 checkpoints (bench/transformers_decode.py).

    python bench/build_bench_model.py --out /tmp/bench-model [--layers 16 --hidden 4096 ...]

Weights are drawn on ``--device`` (a GPU makes this a few seconds per layer) and written one
safetensors file per layer, so peak host memory is one layer.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

TILE = 128
FP8_MAX = 448.0


def fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, C] float -> (float8_e4m3fn [R, C], fp32 scale_inv [ceil(R/128), ceil(C/128)])."""
    rows, cols = w.shape
    padded = torch.nn.functional.pad(w.float(), (0, -cols % TILE, 0, -rows % TILE))
    tiles = padded.view(padded.shape[0] // TILE, TILE, padded.shape[1] // TILE, TILE)
    scale = tiles.abs().amax(dim=(1, 3)).clamp_min(1e-12) / FP8_MAX
    codes = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return codes.view(padded.shape)[:rows, :cols].contiguous(), scale


def config_for(args: argparse.Namespace) -> dict:
    return {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.dense_inter,
        "moe_intermediate_size": args.moe_inter,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "n_shared_experts": 1,
        "n_routed_experts": args.experts,
        "num_experts_per_tok": args.top_experts,
        "n_group": args.groups,
        "topk_group": args.top_groups,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "kv_lora_rank": 512,
        "q_lora_rank": args.q_lora,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "index_n_heads": args.index_heads,
        "index_head_dim": 128,
        "index_topk": args.index_topk,
        "first_k_dense_replace": 1,
        "max_position_embeddings": args.max_len,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    }


def _projection_of(out: dict, name: str, rows: int, cols: int, device: str, fp8: bool) -> None:
    w = torch.randn(rows, cols, device=device) * cols**-0.5
    codes, scale = fp8_block(w)
    if fp8:
        out[f"{name}.weight"] = codes.cpu()
        out[f"{name}.weight_scale_inv"] = scale.cpu()
        return
    # The same values decoded (for peers that read bf16 checkpoints, e.g. transformers).
    tiles = scale.repeat_interleave(TILE, 0).repeat_interleave(TILE, 1)[:rows, :cols]
    out[f"{name}.weight"] = (codes.float() * tiles).to(torch.bfloat16).cpu()


def _norm(out: dict, name: str, width: int) -> None:
    out[f"{name}.weight"] = torch.ones(width, dtype=torch.bfloat16)


def layer_tensors(
    config: dict, index: int, device: str, fp8: bool = True
) -> dict[str, torch.Tensor]:
    c, out = config, {}

    def _projection(out: dict, name: str, rows: int, cols: int, device: str) -> None:
        _projection_of(out, name, rows, cols, device, fp8)

    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    p, a = f"model.layers.{index}.", f"model.layers.{index}.self_attn."
    _norm(out, p + "input_layernorm", hidden)
    _norm(out, p + "post_attention_layernorm", hidden)
    _projection(out, a + "q_a_proj", c["q_lora_rank"], hidden, device)
    _norm(out, a + "q_a_layernorm", c["q_lora_rank"])
    _projection(out, a + "q_b_proj", heads * 192, c["q_lora_rank"], device)
    _projection(out, a + "kv_a_proj_with_mqa", 576, hidden, device)
    _norm(out, a + "kv_a_layernorm", 512)
    _projection(out, a + "kv_b_proj", heads * 256, 512, device)
    _projection(out, a + "o_proj", hidden, heads * 128, device)
    _projection(out, a + "indexer.wq_b", c["index_n_heads"] * 128, c["q_lora_rank"], device)
    _projection(out, a + "indexer.wk", 128, hidden, device)
    _norm(out, a + "indexer.k_norm", 128)
    out[a + "indexer.k_norm.bias"] = torch.zeros(128, dtype=torch.bfloat16)
    out[a + "indexer.weights_proj.weight"] = (
        torch.randn(c["index_n_heads"], hidden) * hidden**-0.5
    ).to(torch.bfloat16)
    m = p + "mlp."
    if index < c["first_k_dense_replace"]:
        inter = c["intermediate_size"]
        _projection(out, m + "gate_proj", inter, hidden, device)
        _projection(out, m + "up_proj", inter, hidden, device)
        _projection(out, m + "down_proj", hidden, inter, device)
        return out
    inter, experts = c["moe_intermediate_size"], c["n_routed_experts"]
    out[m + "gate.weight"] = (torch.randn(experts, hidden) * hidden**-0.5).to(torch.bfloat16)
    out[m + "gate.e_score_correction_bias"] = torch.zeros(experts)
    for e in range(experts):
        _projection(out, f"{m}experts.{e}.gate_proj", inter, hidden, device)
        _projection(out, f"{m}experts.{e}.up_proj", inter, hidden, device)
        _projection(out, f"{m}experts.{e}.down_proj", hidden, inter, device)
    _projection(out, m + "shared_experts.gate_proj", inter, hidden, device)
    _projection(out, m + "shared_experts.up_proj", inter, hidden, device)
    _projection(out, m + "shared_experts.down_proj", hidden, inter, device)
    return out


def build(args: argparse.Namespace) -> Path:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = config_for(args)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(args.seed)
    start, total = time.time(), 0
    weight_map: dict[str, str] = {}  # the shard index Hugging Face loaders read
    for index in range(config["num_hidden_layers"]):
        tensors = layer_tensors(config, index, args.device, fp8=not args.bf16)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        file = f"layer-{index:03d}.safetensors"
        save_file(tensors, out_dir / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, file)
        print(f"layer {index}: {total / 2**30:.2f} GiB so far, {time.time() - start:.0f} s")
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    rest = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden).to(torch.bfloat16),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "lm_head.weight": (torch.randn(vocab, hidden) * hidden**-0.5).to(torch.bfloat16),
    }
    total += sum(t.numel() * t.element_size() for t in rest.values())
    save_file(rest, out_dir / "embed-head.safetensors", metadata={"format": "pt"})
    weight_map |= dict.fromkeys(rest, "embed-head.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {out_dir}: {total / 2**30:.2f} GiB in {time.time() - start:.0f} s")
    return out_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--q-lora", type=int, default=1536)
    parser.add_argument("--index-heads", type=int, default=64)
    parser.add_argument("--index-topk", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-experts", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--top-groups", type=int, default=4)
    parser.add_argument("--moe-inter", type=int, default=1024)
    # A multiple of 128, as DeepSeek's widths are (18432): FP8 activations are quantized in
    # groups of 128 columns (--linear-activation-dtype fp8), and the down projection reads this.
    parser.add_argument("--dense-inter", type=int, default=11008)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--max-len", type=int, default=163840)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bf16", action="store_true", help="the same weights decoded to bf16 (for transformers)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args(argv)


if __name__ == "__main__":
    build(parse_args())
