"""Mistral Large 4, from seed 002 (vLLM day-0 support for Mistral Large 4, in Chinese).

What the seed fixes: 72 decoder layers, all MLA (KV LoRA rank 512, RoPE dim 64) with a DSA
indexer picking the top 2048; every 4th layer is NoPE; 28 layers reuse the top-k of the nearest
earlier indexer layer, so 44 layers run an indexer ("44 indexer layers" in the DCP profile);
the NoPE layers 39-71 (nine of them) read the latent written by layer 35 and own no cache, so
63 of 72 layers own a latent cache. Per token: 63 x 656 = 41,328 B of fp8_ds_mla latent and
44 x 132 = 5,808 B of FP8 index keys, 47,136 in all; 42,096 with plain e4m3 (ROCm) and 78,384
with bf16 (the 1.86x). The DSpark drafter has 3 sliding-window MLA layers, window 2048, bf16,
in a cache group of their own (about 7 MB per request, replicated on every DCP rank).
"""

from __future__ import annotations

from hwrun.kv.specs import (
    IndexKeySpec,
    LatentSpec,
    LayerSpec,
    ModelSpec,
    SlidingWindowSpec,
)

NUM_LAYERS = 72
KV_OWNER = 35
NOPE_LAYERS = tuple(range(3, NUM_LAYERS, 4))  # every 4th layer: 3, 7, ..., 71 (35 among them)
KV_CONSUMERS = tuple(layer for layer in NOPE_LAYERS if layer > KV_OWNER)  # 39, 43, ..., 71
# Not in the seed: which 28 layers share. Assumed: NoPE layers run their own (NoPE) indexer (the
# seed: "NoPE layers use a NoPE indexer"; the nine consumers "each have their own indexer"),
# layers 4g run one, 4g+1 share, and 4g+2 runs one in the first eight groups (up to layer 30)
# and shares after. Only the counts 44 / 28 enter any byte figure.
INDEXER_SHARERS = tuple(
    layer for layer in range(NUM_LAYERS) if layer % 4 == 1 or (layer % 4 == 2 and layer > 30)
)
INDEXER = IndexKeySpec(format="fp8", heads=64, head_dim=128, topk=2048)
DRAFT_LAYERS = 3
DRAFT_WINDOW = SlidingWindowSpec(window=2048, format="bf16")

ASSUMPTIONS = (
    "NoPE layers are 0-indexed 3, 7, ..., 71; layers 39, 43, ..., 71 read layer 35's latent",
    "indexer-sharing layers: 4g+1 for every g and 4g+2 from layer 34 on (28 layers); the seed "
    "gives the count, not the positions",
    "indexer: 64 heads x 128 dims (DeepSeek-V3.2's; the seed does not say)",
    "NoPE layers keep the same row layout (the seed: RoPE dim 0 with the same kernels and cache)",
)
SOURCE = "seed 002_d0b2628464329586 (vLLM day-0 support for Mistral Large 4)"


def _layer(index: int) -> LayerSpec:
    nope = index in NOPE_LAYERS
    sharer = index in INDEXER_SHARERS
    owner = max(i for i in range(index) if i not in INDEXER_SHARERS) if sharer else None
    return LayerSpec(
        index=index,
        latent=LatentSpec(format="fp8_ds_mla", nope=nope),
        indexer=None if sharer else INDEXER,
        latent_owner=KV_OWNER if index in KV_CONSUMERS else None,
        indexer_owner=owner,
    )


def mistral_large_4() -> ModelSpec:
    layers = tuple(_layer(index) for index in range(NUM_LAYERS))
    return ModelSpec("mistral-large-4", layers, SOURCE, ASSUMPTIONS)


def mistral_large_4_dspark() -> ModelSpec:
    """Mistral Large 4 with its DSpark drafter's sliding-window layers (per-request state)."""
    drafts = tuple(
        LayerSpec(index=NUM_LAYERS + i, window=DRAFT_WINDOW) for i in range(DRAFT_LAYERS)
    )
    base = mistral_large_4()
    return ModelSpec("mistral-large-4-dspark", base.layers + drafts, SOURCE, ASSUMPTIONS)
