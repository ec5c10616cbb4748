"""Kimi K3 and Kimi K3.1 Pro, from seed 000 (vLLM day-0 support for Kimi K3.1 Pro).

From the seed: 93 layers, 69 KDA + 24 full attention; K3's full-attention layers are dense MLA,
K3.1 Pro adds a DSA indexer to each (32 heads x 128 dims, top-2048, NoPE), FP8 index keys of
132 B. K3's FP8 latent is plain e4m3 (576 B per token per layer: 24 x 576 = 13,824).
"""

from __future__ import annotations

from hwrun.kv.specs import IndexKeySpec, KDAStateSpec, LatentSpec, LayerSpec, ModelSpec

NUM_LAYERS = 93
# Kimi Linear's pattern (3 KDA : 1 MLA, the last layer full attention), which gives the seed's
# 24 full-attention layers out of 93: 1-indexed 4, 8, ..., 92 and 93.
FULL_ATTENTION_LAYERS = (*range(3, NUM_LAYERS - 1, 4), NUM_LAYERS - 1)

# Not in the seed: KDA shape. Assumed like Kimi Linear (head_dim 128, K = V, fp32 recurrent state,
# short convolutions of kernel 4 in bf16) with as many KDA heads as K3's 96 attention heads.
KDA = KDAStateSpec(heads=96, key_dim=128, value_dim=128)

ASSUMPTIONS = (
    "full-attention layers are 0-indexed 3, 7, ..., 91 and 92 (Kimi Linear's 3:1 pattern with a "
    "full last layer; the seed gives only the counts 69 KDA + 24 full)",
    "KDA: 96 heads, K = V = 128, fp32 recurrent state, conv kernel 4 in bf16 (not in the seed)",
    "the MLA latent keeps its 64 RoPE dims in the row although the layers are NoPE (576 B in "
    "e4m3, as the seed's 13,824 = 24 x 576 requires)",
)
SOURCE = "seed 000_91e7445d181bbb09 (vLLM day-0 support for Kimi K3.1 Pro)"


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
