"""Reference DSA top-k (`indexer.topk`) and logical -> physical cache slots (`indexer.to_slots`).

The top-k fixes a total order so the result is reproducible and batch-invariant: a higher score
first; among equal scores the smallest index first (-0.0 and +0.0 are equal); -inf scores inside
the row's range are candidates, but only after every finite (or +inf) score; NaN counts as -inf.
Vendor kernels may break ties differently; the conformance suite compares index sets.
"""

from __future__ import annotations

import torch

from hwrun.ops.contract import OpContract
from hwrun.registry import OpSpec

_INT_DTYPES = (torch.int32, torch.int64)


def _check_int_vector(name: str, t: torch.Tensor, length: int) -> None:
    if t.dtype not in _INT_DTYPES or t.shape != (length,):
        raise ValueError(
            f"{name} must be an int32 tensor of shape [{length}], got {t.dtype} {list(t.shape)}"
        )


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32, first valid column of each row
    ends: torch.Tensor,  # [R] int32, one past the last valid column
    k: int,
) -> torch.Tensor:  # [R, k] int32, column - start, -1 where the row has fewer than k columns
    """The ``k`` best columns of each row's range ``[starts[r], ends[r])``, best first.

    Indices are relative to the row's start. A row whose range holds fewer than ``k`` columns
    returns all of them (in score order) and then -1. Order: higher score first; equal scores by
    smallest index; -inf (and NaN, treated as -inf) only after every other score of the range.
    ``0 <= starts[r] <= ends[r] <= L`` is required. Each row depends only on its own values.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise ValueError(f"k must be a positive int (2048 in the models), got {k!r}")
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be float32 [R, L], got {logits.dtype} {list(logits.shape)}")
    rows, length = logits.shape
    _check_int_vector("starts", starts, rows)
    _check_int_vector("ends", ends, rows)
    starts, ends = starts.long(), ends.long()
    if bool(((starts < 0) | (ends < starts) | (ends > length)).any()):
        raise ValueError(
            f"every row needs 0 <= start <= end <= L={length}; got starts={starts.tolist()}, "
            f"ends={ends.tolist()}"
        )
    column = torch.arange(length, device=logits.device)
    inside = (column >= starts[:, None]) & (column < ends[:, None])
    scores = torch.where(logits.isnan(), float("-inf"), logits)
    # Two stable sorts make a lexicographic key (outside last, higher score, smaller index):
    # the first orders by score with ties kept in index order, the second moves outside
    # columns to the end without disturbing that order.
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    outside_sorted = (~inside).gather(1, by_score).to(torch.int8)
    order = torch.sort(outside_sorted, dim=1, stable=True).indices
    best = by_score.gather(1, order)[:, :k]
    best_inside = inside.gather(1, best)
    out = torch.where(best_inside, best - starts[:, None], torch.full_like(best, -1))
    if out.shape[1] < k:
        pad = torch.full((rows, k - out.shape[1]), -1, dtype=out.dtype, device=out.device)
        out = torch.cat([out, pad], dim=1)
    return out.to(torch.int32)


def to_slots(
    indices: torch.Tensor,  # [R, k] int32, token positions within each row's request (-1 = none)
    block_table: torch.Tensor,  # [B, max_blocks] int32
    block_size: int,
    request_of_row: torch.Tensor | None = None,  # [R] int, the request of each row
) -> torch.Tensor:  # [R, k] int32 physical slots, -1 where indices is -1
    """Physical cache slots of logical token positions: ``table[req, i // bs] * bs + i % bs``.

    ``request_of_row`` None means the rows are request-major with ``R // B`` rows per request
    (the ``[B * n]`` rows of ``indexer.logits_paged``), so ``R`` must be a multiple of ``B``.
    -1 stays -1; any other negative index, a position past the table, or an unallocated
    (negative) table entry raises ValueError.
    """
    problems = to_slots_arg_problems(indices, block_table, block_size, request_of_row)
    if problems:
        raise ValueError("; ".join(problems))
    rows, (requests, max_blocks) = indices.shape[0], block_table.shape
    if request_of_row is None:
        request_of_row = torch.arange(rows, device=indices.device) // (rows // requests)
    elif bool(((request_of_row < 0) | (request_of_row >= requests)).any()):
        raise ValueError(f"request_of_row must lie in [0, {requests}), got {request_of_row}")
    idx = indices.long()
    valid = idx >= 0
    if bool((idx < -1).any()):
        raise ValueError("indices may hold -1 for 'no token', never another negative value")
    if bool((idx >= max_blocks * block_size).any()):
        raise ValueError(
            f"an index reaches past the block table ({max_blocks} blocks of {block_size} = "
            f"{max_blocks * block_size} tokens); got max {int(idx.max())}"
        )
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    req = request_of_row.long()[:, None].expand_as(safe)
    blocks = block_table.long()[req, safe // block_size]
    if bool((valid & (blocks < 0)).any()):
        raise ValueError("an index points into a block-table entry that is unallocated (< 0)")
    slots = blocks * block_size + safe % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1)).to(torch.int32)


def to_slots_arg_problems(
    indices: torch.Tensor,  # [R, k] int
    block_table: torch.Tensor,  # [B, max_blocks] int
    block_size: int,
    request_of_row: torch.Tensor | None,  # [R] int
) -> list[str]:
    """Every reason the arguments' types and shapes cannot be mapped to slots (empty: they can).
    Reads no tensor values, so a graph-safe impl may call it inside a CUDA graph."""
    problems = []
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        problems.append(f"block_size must be a positive int, got {block_size!r}")
    if indices.dim() != 2 or indices.dtype not in _INT_DTYPES:
        problems.append(f"indices must be int32 [R, k], got {indices.dtype} {list(indices.shape)}")
    if block_table.dim() != 2 or block_table.dtype not in _INT_DTYPES:
        problems.append(
            f"block_table must be int32 [B, max_blocks], got {block_table.dtype} "
            f"{list(block_table.shape)}"
        )
    if problems:
        return problems
    rows, requests = indices.shape[0], block_table.shape[0]
    if request_of_row is None:
        if requests == 0 or rows % requests != 0:
            problems.append(
                f"without request_of_row, R={rows} rows must be a multiple of B={requests} "
                "(n rows per request, request-major); pass request_of_row otherwise"
            )
    elif request_of_row.dtype not in _INT_DTYPES or request_of_row.shape != (rows,):
        problems.append(
            f"request_of_row must be an int32 tensor of shape [{rows}], got "
            f"{request_of_row.dtype} {list(request_of_row.shape)}"
        )
    return problems


def _validate_topk(spec: OpSpec) -> list[str]:
    if spec.topk is not None and spec.topk <= 0:
        return [f"topk must be positive, got {spec.topk}"]
    if spec.dtype not in (None, "float32"):
        return [f"logits are float32, got {spec.dtype}"]
    return []


def _validate_to_slots(spec: OpSpec) -> list[str]:
    if spec.block_size is not None and spec.block_size <= 0:
        return [f"block_size must be positive, got {spec.block_size}"]
    return []


CONTRACTS: list[OpContract] = [
    OpContract(
        name="indexer.topk",
        summary="k best columns per row range, relative to the start; smallest index wins ties",
        reference=topk,
        default_spec=OpSpec(op="indexer.topk", dtype="float32", topk=2048),
        reference_validate=_validate_topk,
    ),
    OpContract(
        name="indexer.to_slots",
        summary="logical top-k positions -> physical cache slots through the block table",
        reference=to_slots,
        default_spec=OpSpec(op="indexer.to_slots", block_size=64, topk=2048),
        reference_validate=_validate_to_slots,
    ),
]
