"""Top-k wrong only when a row's window spans more than one 4096-column tile (the merge of the
tiles' candidates is missing: only the first tile is ranked)."""

import torch
from kernel_bug import bug_hooks

from hwrun.ops import topk

TILE = 4096


def topk_first_tile_only(logits, starts, ends, k):
    return topk.topk(logits, starts, torch.minimum(ends, starts + TILE), k)


hwrun_api_version, hwrun_platform, hwrun_register_ops, hwrun_capabilities = bug_hooks(
    "bug-multi-tile",
    "indexer.topk",
    topk_first_tile_only,
    "wrong only when a row spans more than one tile",
)
