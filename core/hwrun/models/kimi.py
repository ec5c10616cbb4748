"""Kimi K3 and Kimi K3.1 Pro, from seed 000 (vLLM day-0 support for Kimi K3.1 Pro).

From the seed: 93 layers, 69 KDA + 24 full attention; K3's full-attention layers are dense MLA,
K3.1 Pro adds a DSA indexer to each (32 heads x 128 dims, top-2048, NoPE), FP8 index keys of
132 B. K3's FP8 latent is plain e4m3 (576 B per token per layer: 24 x 576 = 13,824).
"""

from __future__ import annotations

from hwrun.kv.specs import IndexKeySpec, KDAStateSpec, LatentSpec, LayerSpec, ModelSpec

NUM_LAYERS = 93
# Kimi K3's public config.json (text_config.linear_attn_config, 1-indexed): full attention at
# 4, 8, ..., 92 and 93; the other 69 layers are KDA. 0-indexed here.
FULL_ATTENTION_LAYERS = (*range(3, NUM_LAYERS - 1, 4), NUM_LAYERS - 1)

# KDA shape from the same config: num_heads 96, head_dim 128, short_conv_kernel_size 4. The state
# dtypes are vLLM's (fp32 recurrent state, conv states in the bf16 model dtype).
KDA = KDAStateSpec(heads=96, key_dim=128, value_dim=128)

ASSUMPTIONS = (
    "layer positions and KDA shape (96 heads x 128, conv kernel 4) from Kimi K3's public "
    "config.json; K3.1 Pro is taken to keep them (the seed: same architecture plus indexers)",
    "KDA state dtypes: fp32 recurrent state, bf16 conv states (vLLM's choice; not in the seed)",
    "the MLA latent keeps its 64 RoPE dims in the row although the layers are NoPE (576 B in "
    "e4m3, as the seed's 13,824 = 24 x 576 requires)",
)
SOURCE = (
    "seed 000_91e7445d181bbb09 (vLLM day-0 support for Kimi K3.1 Pro) and Kimi K3's public "
    "config.json (tests/models/fixtures/kimi_k3_config.json holds the keys used)"
)


def _build(name: str, indexer: IndexKeySpec | None, latent_format: str) -> ModelSpec:
    layers = []
    for index in range(NUM_LAYERS):
        if index in FULL_ATTENTION_LAYERS:
            latent = LatentSpec(format=latent_format, nope=True)
            layers.append(LayerSpec(index=index, latent=latent, indexer=indexer))
        else:
            layers.append(LayerSpec(index=index, kda=KDA))
    return ModelSpec(name=name, layers=tuple(layers), source=SOURCE, assumptions=ASSUMPTIONS)


def kimi_k3() -> ModelSpec:
    return _build("kimi-k3", None, "fp8_e4m3")


def kimi_k31_pro() -> ModelSpec:
    indexer = IndexKeySpec(format="fp8", heads=32, head_dim=128, topk=2048)
    return _build("kimi-k3.1-pro", indexer, "fp8_e4m3")
