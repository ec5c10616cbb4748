"""Paged indexer logits wrong only in a context's last block when it is partial (a loop over
whole blocks that leaves the tail's scores at 0)."""

from kernel_bug import bug_hooks

from hwrun.ops import indexer


def logits_paged_tail_left_zero(q, weights, cache, fmt, block_table, context_lens, max_ctx):
    out = indexer.logits_paged(q, weights, cache, fmt, block_table, context_lens, max_ctx)
    block_size = cache.shape[1] // _bytes_per_token(fmt)
    for row, length in enumerate(context_lens.reshape(-1).tolist()):
        tail = length % block_size
        if tail:
            out[row, length - tail : length] = 0.0
    return out


def _bytes_per_token(fmt: str) -> int:
    from hwrun.formats.index_keys import get_index_key_format

    return get_index_key_format(fmt).bytes_per_token


hwrun_api_version, hwrun_platform, hwrun_register_ops, hwrun_capabilities = bug_hooks(
    "bug-partial-block",
    "indexer.logits_paged",
    logits_paged_tail_left_zero,
    "wrong only in the last partial block of a paged cache",
)
