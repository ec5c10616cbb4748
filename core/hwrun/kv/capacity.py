"""KV capacity: pool tokens for a memory budget, concurrent requests, decode bytes read.

The pool is ``budget // row_bytes`` rows. Pool tokens count every row as ``block_size`` tokens,
as vLLM's "GPU KV cache size" does (the seeds' 3.04M / 21.8M): a GPU stores that many local
tokens, and a model replica (its TP group) holds ``dcp`` times as many distinct tokens because
DCP shards by token while TP replicates. Concurrency is exact instead: a request at context L
takes ``ceil(ceil(L / dcp) / block_size)`` token rows plus its state rows (KDA states, windows).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwrun.kv.layout import PackedLayout
from hwrun.kv.specs import ModelSpec, index_key_bytes, latent_row_bytes


@dataclass(frozen=True)
class Capacity:
    """What one GPU's KV budget holds under one packed layout."""

    budget_bytes: int  # KV pool bytes per GPU
    num_blocks: int  # rows in the pool
    tokens_per_gpu: int  # local tokens a GPU's pool stores
    tokens_per_cluster: int  # distinct context tokens of one model replica (TP group)
    context: int | None = None
    rows_per_request: int | None = None
    concurrent_requests: int | None = None  # whole requests at ``context``, state included

    @property
    def context_fills(self) -> float | None:
        """How many contexts of ``context`` tokens the pool holds, ignoring per-request state
        (the seeds' "2.9 concurrent 1M-token requests" is this number)."""
        return None if self.context is None else self.tokens_per_cluster / self.context


def kv_budget(
    gpu_bytes: int, utilization: float = 1.0, weights_bytes: int = 0, overhead_bytes: int = 0
) -> int:
    """KV pool bytes per GPU: the usable share of its memory less weights and other overheads
    (activations, CUDA graphs, DCP workspaces), as vLLM sizes its cache."""
    if not 0 < utilization <= 1:
        raise ValueError(f"memory utilization must be in (0, 1], got {utilization}")
    budget = int(gpu_bytes * utilization) - weights_bytes - overhead_bytes
    if budget <= 0:
        raise ValueError(
            f"{gpu_bytes} B x {utilization} leaves nothing for the KV cache after "
            f"{weights_bytes} B of weights and {overhead_bytes} B of overheads"
        )
    return budget


def rows_per_request(layout: PackedLayout, context: int) -> int:
    """Rows one request at ``context`` tokens takes on each GPU (token rows + state rows)."""
    local_tokens = -(-context // layout.dcp)
    return -(-local_tokens // layout.block_size) + layout.state_rows_per_request


def plan_capacity(layout: PackedLayout, budget_bytes: int, context: int | None = None) -> Capacity:
    """Capacity of ``budget_bytes`` of KV memory per GPU; with ``context``, also concurrency."""
    if budget_bytes < layout.row_bytes:
        raise ValueError(
            f"a KV budget of {budget_bytes} B per GPU holds no block of {layout.row_bytes} B; "
            "give the memory left for the KV cache after weights and activations"
        )
    if context is not None and context < 1:
        raise ValueError(f"context must be >= 1 token, got {context}")
    num_blocks = budget_bytes // layout.row_bytes
    tokens = num_blocks * layout.block_size
    if context is None:
        return Capacity(budget_bytes, num_blocks, tokens, tokens * layout.dcp)
    rows = rows_per_request(layout, context)
    return Capacity(
        budget_bytes, num_blocks, tokens, tokens * layout.dcp, context, rows, num_blocks // rows
    )


def decode_bytes_read(model: ModelSpec, context: int, sparse: bool = True) -> int:
    """Cache bytes one decode query token reads at ``context``, all layers, before DCP.

    Sparse layers scan the index keys of the whole context (owners of an indexer only) and read
    the latent of ``min(topk, context)`` tokens; with ``sparse=False`` every MLA layer reads the
    latent of the whole context, as dense MLA does. Per-request states are not counted.
    """
    by_index = {layer.index: layer for layer in model.layers}
    total = 0
    for layer in model.layers:
        if layer.latent is None:
            continue
        source = by_index[layer.latent_owner] if layer.latent_owner is not None else layer
        row = latent_row_bytes(source.latent.format)
        if not (sparse and layer.is_sparse):
            total += context * row
            continue
        indexer = layer.indexer or by_index[layer.indexer_owner].indexer
        total += min(indexer.topk, context) * row
        if layer.owns_index_keys:
            total += context * index_key_bytes(layer.indexer.format)
    return total


def decode_read_fraction(model: ModelSpec, context: int) -> float:
    """Decode cache bytes read with the indexers, as a fraction of dense MLA's (same formats)."""
    return decode_bytes_read(model, context) / decode_bytes_read(model, context, sparse=False)
