"""The capacity section: bytes per token by component and format, the KV pool under TP and
under DCP for 1 to 8 GPUs, and concurrent requests at 128K and 1M tokens, from the KV planner
(:mod:`hwrun.kv`) alone: nothing is measured.

The pool depends on the KV budget per GPU, which depends on the deployment (GPU memory,
weights, activations): the report takes one budget (``--kv-budget``) and prints it beside every
table, rather than guess a card and a checkpoint.
"""

from __future__ import annotations

from typing import Any

from hwrun.kv.capacity import plan_capacity
from hwrun.kv.errors import PlanError
from hwrun.kv.footprint import footprint, parallel_reasons
from hwrun.kv.layout import plan_packed_layout
from hwrun.kv.specs import ModelSpec, index_key_format_names, latent_format_names

DEFAULT_KV_BUDGET = 100 * 10**9  # bytes of KV pool per GPU when --kv-budget is not given
GPU_COUNTS = (1, 2, 4, 8)
CONTEXTS = {"128K": 128 * 2**10, "1M": 2**20}


def capacity_section(model: ModelSpec, kv_budget: int) -> dict[str, Any]:
    """The JSON-able capacity of ``model``; configurations the planner refuses are listed with
    their reasons instead of numbers."""
    return {
        "model": model.name,
        "source": model.source,
        "latent_format": _formats(model, latent=True),
        "index_format": _formats(model, latent=False),
        "kv_budget_per_gpu": kv_budget,
        "bytes_per_token": _bytes_per_token(model),
        "pool": _pool(model, kv_budget),
        "assumptions": list(model.assumptions),
    }


def _formats(model: ModelSpec, latent: bool) -> str | None:
    if latent:
        names = {layer.latent.format for layer in model.layers if layer.owns_latent}
    else:
        names = {layer.indexer.format for layer in model.layers if layer.owns_index_keys}
    return ",".join(sorted(names)) or None


def _bytes_per_token(model: ModelSpec) -> list[dict[str, Any]]:
    """Per GPU at TP1 for every latent x index-key format (only the model's own when it has no
    latent or no index-key cache): bytes per context token by component, KDA state per request."""
    has_latent = any(layer.owns_latent for layer in model.layers)
    has_index = any(layer.owns_index_keys for layer in model.layers)
    latents = latent_format_names() if has_latent else [None]
    indexes = index_key_format_names() if has_index else [None]
    rows = []
    for latent in latents:
        for index in indexes:
            variant = model.with_formats(latent=latent, index=index)
            fp = footprint(variant)
            per_token = fp.per_global_token()
            rows.append(
                {
                    "latent_format": latent,
                    "index_format": index,
                    "latent": per_token["latent"],
                    "index_keys": per_token["index_keys"],
                    "total": per_token["total"],
                    "kda_state_per_request": fp.kda_bytes_per_request,
                    "sliding_window_per_request": fp.window_bytes_per_request,
                }
            )
    return rows


def _pool(model: ModelSpec, kv_budget: int) -> list[dict[str, Any]]:
    """For 1..8 GPUs, TP alone and TP with DCP over every GPU: pool tokens of one replica and
    whole requests at 128K and 1M tokens."""
    rows = []
    for gpus in GPU_COUNTS:
        for mode, dcp in (("TP", 1), ("DCP", gpus)):
            if mode == "DCP" and gpus == 1:
                continue
            row: dict[str, Any] = {"gpus": gpus, "mode": mode, "tp": gpus, "dcp": dcp}
            reasons = parallel_reasons(model, gpus, dcp)
            heads = model.attention_heads
            if heads is not None and heads % gpus:
                reasons.append(f"TP {gpus} does not divide the model's {heads} attention heads")
            if not reasons:
                try:
                    layout = plan_packed_layout(model, gpus, dcp)
                    pool = plan_capacity(layout, kv_budget)
                    row["tokens_per_replica"] = pool.tokens_per_cluster
                    for label, context in CONTEXTS.items():
                        cap = plan_capacity(layout, kv_budget, context)
                        row[f"concurrent_{label}"] = cap.concurrent_requests
                except (PlanError, ValueError) as err:
                    reasons.append(str(err))
            if reasons:
                row["refused"] = reasons
            rows.append(row)
    return rows
