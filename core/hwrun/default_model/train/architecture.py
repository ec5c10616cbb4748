"""The default model's architecture: a DeepseekV32 small enough to ship (<= 20 MB in bf16).

What hwrun's ops fix is kept at DeepSeek-V3.2's values: a 512-wide latent plus a 64-wide rotary
part (576-wide latent rows), 128-wide index keys. Everything else is scaled down; the indexer
keeps `index_topk` at an eighth of the trained context, so attention really is sparse.
"""

from __future__ import annotations

from transformers import DeepseekV32Config

SEQ_LEN = 512
INDEX_TOPK = 64


def model_config(
    vocab_size: int, bos_token_id: int = 0, eos_token_id: int = 1, pad_token_id: int = 2
):
    return DeepseekV32Config(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=5,
        first_k_dense_replace=1,
        intermediate_size=512,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=96,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        index_n_heads=8,
        index_head_dim=128,
        index_topk=INDEX_TOPK,
        n_routed_experts=16,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=64,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        max_position_embeddings=SEQ_LEN,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        initializer_range=0.02,
    )
