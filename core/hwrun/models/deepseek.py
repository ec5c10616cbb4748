"""DeepSeek-V3.2 (Hugging Face deepseek-ai/DeepSeek-V3.2, DeepseekV32ForCausalLM).

61 layers, each MLA (kv_lora_rank 512 + qk_rope_head_dim 64) with a DSA indexer of 64 heads x
128 dims selecting the top 2048. The MTP layer (num_nextn_predict_layers 1) is left out: it
has a cache only when speculative decoding runs it.
"""

from __future__ import annotations

from hwrun.kv.specs import IndexKeySpec, LatentSpec, LayerSpec, ModelSpec

NUM_LAYERS = 61
INDEXER = IndexKeySpec(format="fp8", heads=64, head_dim=128, topk=2048)


def deepseek_v32() -> ModelSpec:
    layers = tuple(
        LayerSpec(index=index, latent=LatentSpec(format="fp8_ds_mla"), indexer=INDEXER)
        for index in range(NUM_LAYERS)
    )
    return ModelSpec(
        name="deepseek-v3.2",
        layers=layers,
        source="config.json of deepseek-ai/DeepSeek-V3.2 (num_hidden_layers 61, index_n_heads "
        "64, index_head_dim 128, index_topk 2048)",
        assumptions=(
            "latent stored as fp8_ds_mla and index keys as fp8 (vLLM's FlashMLA sparse path)",
            "the MTP layer is not counted",
        ),
        attention_heads=128,  # num_attention_heads of the same config.json
    )
