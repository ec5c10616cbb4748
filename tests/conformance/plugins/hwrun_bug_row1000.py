"""Top-k wrong only in rows past 1000 (a second wave of programs indexing from the wrong base)."""

import torch
from kernel_bug import bug_hooks

from hwrun.ops import topk


def topk_wrong_past_row_1000(logits, starts, ends, k):
    out = topk.topk(logits, starts, ends, k)
    late = out[1000:]
    length = (ends[1000:] - starts[1000:]).clamp(min=1)[:, None]
    out[1000:] = torch.where(late >= 0, (late + 1) % length, late)
    return out


hwrun_api_version, hwrun_platform, hwrun_register_ops, hwrun_capabilities = bug_hooks(
    "bug-row1000", "indexer.topk", topk_wrong_past_row_1000, "wrong only past row 1000"
)
