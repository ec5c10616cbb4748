"""The DSA / KDA contracts in the catalogue: names, documented references, specs and refusals."""

from __future__ import annotations

import dataclasses

import pytest

from hwrun.ops.catalogue import catalogue

OPS = [
    "kv.write_latent",
    "kv.write_index_keys",
    "indexer.logits_ragged",
    "indexer.logits_paged",
    "indexer.topk",
    "indexer.to_slots",
    "sparse_mla.decode",
    "sparse_mla.prefill",
    "attn.lse_combine",
    "kda.step",
    "kda.chunk",
]


@pytest.mark.parametrize("name", OPS)
def test_each_op_is_catalogued_with_a_documented_reference(name):
    contract = catalogue()[name]
    assert contract.default_spec.op == name
    assert contract.reference_validate(contract.default_spec) == []
    doc = contract.reference.__doc__ or ""
    assert len(doc.strip()) > 40, f"{name}: the reference's docstring is the op's documentation"


@pytest.mark.parametrize(
    ("name", "changes", "reason"),
    [
        ("sparse_mla.decode", {"head_dim": 512}, "head_dim must be 576"),
        ("sparse_mla.decode", {"formats": ("fp6",)}, "unknown latent format"),
        ("sparse_mla.prefill", {"dtype": "int8"}, "q must be bfloat16"),
        ("sparse_mla.prefill", {"topk": 0}, "topk must be positive"),
        ("indexer.logits_paged", {"formats": ("int4",)}, "unknown index-key format"),
        ("indexer.logits_ragged", {"head_dim": 64}, "head_dim must be 128"),
        ("indexer.topk", {"topk": -1}, "topk must be positive"),
        ("indexer.to_slots", {"block_size": 0}, "block_size must be positive"),
        ("kv.write_latent", {"formats": ("fp8",)}, "unknown format"),
        ("kv.write_index_keys", {"formats": ("fp8_ds_mla",)}, "unknown format"),
        ("attn.lse_combine", {"dtype": "int32"}, "float32, bfloat16 or float16"),
        ("kda.chunk", {"dtype": "float8_e4m3fn"}, "float32, bfloat16 or float16"),
    ],
)
def test_the_reference_says_why_it_cannot_serve_a_spec(name, changes, reason):
    contract = catalogue()[name]
    reasons = contract.reference_validate(dataclasses.replace(contract.default_spec, **changes))
    assert any(reason in r for r in reasons), reasons
