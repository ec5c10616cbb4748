"""Top-k wrong only when the batch has one row (a split-K path taken at batch 1 only)."""

import torch
from kernel_bug import bug_hooks

from hwrun.ops import topk


def topk_wrong_at_batch_1(logits, starts, ends, k):
    out = topk.topk(logits, starts, ends, k)
    if logits.shape[0] == 1:
        out = torch.where(out >= 0, (out + 1) % (ends - starts).clamp(min=1)[:, None], out)
    return out


hwrun_api_version, hwrun_platform, hwrun_register_ops, hwrun_capabilities = bug_hooks(
    "bug-batch1", "indexer.topk", topk_wrong_at_batch_1, "wrong only at batch 1"
)
