"""Top-k wrong in about 1 row in 1000, picked by the row's data (a race that only some values
trigger): rows whose bits hash to 0 modulo 1009 (a prime: float bits end in runs of 0s)."""

import torch
from kernel_bug import bug_hooks

from hwrun.ops import topk


def rows_picked_by_data(logits: torch.Tensor) -> torch.Tensor:
    bits = logits.nan_to_num(0.0, posinf=0.0, neginf=0.0).view(torch.int32).long()
    mix = (torch.arange(bits.shape[1], dtype=torch.long) * 2654435761 + 97) % (1 << 31)
    return (bits * mix).sum(dim=1) % 1009 == 0


def topk_wrong_in_rare_rows(logits, starts, ends, k):
    out = topk.topk(logits, starts, ends, k)
    length = (ends - starts).clamp(min=1)[:, None]
    wrong = torch.where(out >= 0, (out + 1) % length, out)
    return torch.where(rows_picked_by_data(logits)[:, None], wrong, out)


hwrun_api_version, hwrun_platform, hwrun_register_ops, hwrun_capabilities = bug_hooks(
    "bug-rare-rows", "indexer.topk", topk_wrong_in_rare_rows, "wrong in ~1 row in 1000"
)
