"""EngineConfig.problems: every bad option named at once, with the choices that would do."""

from __future__ import annotations

from hwrun.engine.config import EngineConfig


def test_every_bad_format_and_count_is_named_with_its_choices():
    config = EngineConfig(
        kv_cache_dtype="fp16",
        index_dtype="int8",
        index_query_dtype="fp4",
        linear_activation_dtype="int8",
        expert_activation_dtype="fp4",
        max_num_seqs=0,
    )
    reasons = config.problems()
    for want in (
        "--kv-cache-dtype 'fp16' is not a latent format; choose one of bf16, fp8_ds_mla, "
        "nvfp4_ds_mla",
        "--index-dtype 'int8' is not an index-key format; choose one of bf16, fp8, mxfp4",
        "--index-query-dtype 'fp4' is not an indexer query dtype; choose one of bf16, fp8",
        "--linear-activation-dtype 'int8' is not a linear activation dtype; choose one of "
        "bf16, fp8",
        "--expert-activation-dtype 'fp4' is not an expert activation dtype; choose one of "
        "bf16, fp8",
        "--max-num-seqs must be >= 1",
    ):
        assert want in reasons
    assert EngineConfig().problems() == []  # the defaults (the embedded model) are valid
