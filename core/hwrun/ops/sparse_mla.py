"""Reference sparse absorbed-MLA attention over top-k keys (`sparse_mla.decode`, `.prefill`).

Absorbed MLA: every head's query is 576 wide (512 latent "NoPE" + 64 RoPE) and attends to the
shared 576-wide latent row of each selected token; the value is the row's first 512 elements.
Semantics follow FlashMLA's sparse decode and ``flash_mla_sparse_fwd`` so adapters stay thin:

- scores ``s = softmax_scale * (q . kv)`` in fp32; softmax over the valid entries only.
- -1 marks an invalid entry; entry ``j`` of a row is also invalid when ``j >= topk_length``.
- LSE is the natural log of the row's sum of ``exp(s)`` (FlashMLA's prefill returns base 2:
  multiply it by ln 2; its decode returns ``[B, H, s]``: transpose).
- ``attn_sink[h]`` is one extra logit in the softmax denominator only, as in FlashMLA and
  gpt-oss: ``out *= exp(lse) / (exp(lse) + exp(sink))``. It does not change the returned LSE
  (so a caller that merges parts with ``attn.lse_combine`` applies the sink after merging).
- a row with no valid entry: out 0, LSE -inf (FlashMLA reports +inf there).

Each row is computed on its own (its valid entries in their given order, nothing else), so a
row's result never depends on the rest of the batch nor on where -1 padding sits.
"""

from __future__ import annotations

import torch

from hwrun.formats.latent import LATENT_FORMATS, get_latent_format
from hwrun.ops.contract import OpContract
from hwrun.registry import OpSpec

QK_DIM = 576  # 512 latent + 64 RoPE
V_DIM = 512
_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT_DTYPES = (torch.int32, torch.int64)


def _attend_row(
    q: torch.Tensor,  # [H, 576] float32
    kv: torch.Tensor,  # [n, 576] float32, this row's valid entries only
    softmax_scale: float,
    sink: torch.Tensor | None,  # [H] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # out [H, 512] float32, lse [H] float32
    heads = q.shape[0]
    if kv.shape[0] == 0:
        out = torch.zeros(heads, V_DIM, dtype=torch.float32, device=q.device)
        return out, torch.full((heads,), float("-inf"), device=q.device)
    scores = (q @ kv.T) * softmax_scale  # [H, n]
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[:, None]) @ kv[:, :V_DIM]
    if sink is not None:
        out = out * torch.sigmoid(lse - sink)[:, None]  # = exp(lse) / (exp(lse) + exp(sink))
    return out, lse


def _valid_mask(
    indices: torch.Tensor,  # [R, k] int
    topk_length: torch.Tensor | None,  # [R] int
    limit: int,  # indices must be < limit
    what: str,
) -> torch.Tensor:  # [R, k] bool
    if bool((indices < -1).any()):
        raise ValueError(f"{what} may hold -1 for 'no entry', never another negative value")
    if bool((indices >= limit).any()):
        raise ValueError(
            f"{what} must be < {limit} (the keys available); got max {int(indices.max())}"
        )
    valid = indices >= 0
    if topk_length is not None:
        k = indices.shape[1]
        if bool(((topk_length < 0) | (topk_length > k)).any()):
            raise ValueError(f"topk_length must lie in [0, k={k}], got {topk_length.tolist()}")
        position = torch.arange(k, device=indices.device)
        valid = valid & (position[None, :] < topk_length.long()[:, None])
    return valid


def _check_common(q: torch.Tensor, softmax_scale: float, attn_sink: torch.Tensor | None) -> None:
    if q.dtype not in _Q_DTYPES:
        raise ValueError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    if q.shape[-1] != QK_DIM:
        raise ValueError(f"q's last dim must be {QK_DIM} (512 latent + 64 RoPE), got {q.shape[-1]}")
    if not isinstance(softmax_scale, (int, float)) or not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be a positive float, got {softmax_scale!r}")
    heads = q.shape[-2]
    if attn_sink is not None and attn_sink.shape != (heads,):
        raise ValueError(f"attn_sink must be [H={heads}], got {list(attn_sink.shape)}")


def _run_rows(
    q_rows: torch.Tensor,  # [R, H, 576]
    kv_rows: torch.Tensor,  # [N, 576] float32, decoded keys the rows point into
    entry_of: torch.Tensor,  # [R, k] int64 index into kv_rows (any value where invalid)
    valid: torch.Tensor,  # [R, k] bool
    softmax_scale: float,
    attn_sink: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [R, H, 512] float32, lse [R, H] float32
    rows, heads = q_rows.shape[0], q_rows.shape[1]
    out = torch.empty(rows, heads, V_DIM, dtype=torch.float32, device=q_rows.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=q_rows.device)
    sink = None if attn_sink is None else attn_sink.float()
    for r in range(rows):
        # Fresh contiguous copies: the row's math sees the same shapes, layout and alignment
        # whatever batch or view it came from.
        entries = entry_of[r][valid[r]]
        kv = kv_rows[entries].clone(memory_format=torch.contiguous_format)
        q = q_rows[r].float().clone(memory_format=torch.contiguous_format)
        out[r], lse[r] = _attend_row(q, kv, float(softmax_scale), sink)
    return out, lse


def decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8, one latent row per token
    fmt: str,  # latent format name: "bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"
    slots: torch.Tensor,  # [B, s, k] int32 physical slots, -1 = invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32, entries >= it are invalid
    attn_sink: torch.Tensor | None = None,  # [H] float32, extra logit in the denominator
    latent_scale: float | None = None,  # per-tensor scale of the fp8_e4m3 format only
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512] q.dtype, lse [B, s, H] float32
    """Sparse MLA decode over the selected slots of a paged latent cache.

    Slot ``x`` is row ``x % block_size`` of block ``x // block_size``. Each row (one query
    token) attends to its valid slots through the latent format's decode, in fp32; see the
    module docstring for the softmax, LSE, sink and empty-row conventions.
    """
    _check_common(q, softmax_scale, attn_sink)
    if q.dim() != 4:
        raise ValueError(f"q must be [B, s, H, 576], got {list(q.shape)}")
    batch, next_n, heads, _ = q.shape
    latent = get_latent_format(fmt)
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != latent.row_bytes:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size, {latent.row_bytes}] for {fmt!r}, got "
            f"{cache.dtype} {list(cache.shape)}"
        )
    if slots.dtype not in _INT_DTYPES or slots.dim() != 3 or slots.shape[:2] != (batch, next_n):
        raise ValueError(
            f"slots must be int32 [B={batch}, s={next_n}, k], got {slots.dtype} {list(slots.shape)}"
        )
    if slots.shape[2] <= 0:
        raise ValueError("slots must hold k >= 1 entries per row")
    if topk_length is not None and (
        topk_length.dtype not in _INT_DTYPES or topk_length.shape != (batch, next_n)
    ):
        raise ValueError(f"topk_length must be int32 [B={batch}, s={next_n}]")
    num_blocks, block_size = cache.shape[0], cache.shape[1]
    flat_slots = slots.reshape(batch * next_n, -1).long()
    lengths = None if topk_length is None else topk_length.reshape(-1)
    valid = _valid_mask(flat_slots, lengths, num_blocks * block_size, "slots")
    wanted = flat_slots[valid]
    # Decode each referenced row once; decoding is row by row, so batch-invariant.
    if wanted.numel():
        kv_rows = latent.decode(cache[wanted // block_size, wanted % block_size], latent_scale)
    else:  # nothing to attend to anywhere in the batch
        kv_rows = torch.zeros(0, QK_DIM, dtype=torch.float32, device=q.device)
    entry_of = torch.zeros_like(flat_slots)
    entry_of[valid] = torch.arange(wanted.numel(), device=slots.device)
    out, lse = _run_rows(
        q.reshape(batch * next_n, heads, QK_DIM), kv_rows, entry_of, valid, softmax_scale, attn_sink
    )
    out = out.reshape(batch, next_n, heads, V_DIM).to(q.dtype)
    return out, lse.reshape(batch, next_n, heads)


def prefill(
    q: torch.Tensor,  # [T, H, 576] bfloat16
    kv: torch.Tensor,  # [S, 576] bfloat16 / float32, the gathered latent workspace
    indices: torch.Tensor,  # [T, k] int32 rows of kv, -1 = invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [T] int32, entries >= it are invalid
    attn_sink: torch.Tensor | None = None,  # [H] float32, extra logit in the denominator
) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, H, 512] q.dtype, lse [T, H] float32
    """Sparse MLA prefill over a gathered workspace (FlashMLA ``flash_mla_sparse_fwd`` meaning).

    Same math as :func:`decode` with ``indices`` into ``kv`` instead of cache slots. An index
    ``>= S`` raises ValueError (FlashMLA treats it as invalid; hwrun wants -1 there). The LSE is
    a natural log (FlashMLA's is base 2).
    """
    _check_common(q, softmax_scale, attn_sink)
    if q.dim() != 3:
        raise ValueError(f"q must be [T, H, 576], got {list(q.shape)}")
    tokens = q.shape[0]
    if kv.dim() != 2 or kv.shape[1] != QK_DIM or kv.dtype not in _Q_DTYPES:
        raise ValueError(
            f"kv must be a float [S, {QK_DIM}] tensor, got {kv.dtype} {list(kv.shape)}"
        )
    if indices.dtype not in _INT_DTYPES or indices.dim() != 2 or indices.shape[0] != tokens:
        raise ValueError(
            f"indices must be int32 [T={tokens}, k], got {indices.dtype} {list(indices.shape)}"
        )
    if indices.shape[1] <= 0:
        raise ValueError("indices must hold k >= 1 entries per row")
    if topk_length is not None and (
        topk_length.dtype not in _INT_DTYPES or topk_length.shape != (tokens,)
    ):
        raise ValueError(f"topk_length must be int32 [T={tokens}]")
    idx = indices.long()
    valid = _valid_mask(idx, topk_length, kv.shape[0], "indices")
    out, lse = _run_rows(q, kv.float(), idx, valid, softmax_scale, attn_sink)
    return out.to(q.dtype), lse


def _validate(spec: OpSpec, needs_format: bool) -> list[str]:
    reasons = []
    if spec.head_dim is not None and spec.head_dim != QK_DIM:
        reasons.append(f"head_dim must be {QK_DIM} (absorbed MLA), got {spec.head_dim}")
    if spec.dtype is not None and spec.dtype not in ("bfloat16", "float16", "float32"):
        reasons.append(f"q must be bfloat16, float16 or float32, got {spec.dtype}")
    if spec.topk is not None and spec.topk <= 0:
        reasons.append(f"topk must be positive, got {spec.topk}")
    if needs_format:
        unknown = [f for f in spec.formats if f not in LATENT_FORMATS]
        if unknown:
            reasons.append(f"unknown latent format(s) {unknown}; known: {sorted(LATENT_FORMATS)}")
    return reasons


CONTRACTS: list[OpContract] = [
    OpContract(
        name="sparse_mla.decode",
        summary="absorbed MLA over top-k cache slots (FlashMLA sparse decode), natural-log LSE",
        reference=decode,
        default_spec=OpSpec(
            op="sparse_mla.decode",
            dtype="bfloat16",
            formats=("fp8_ds_mla",),
            num_heads=128,
            head_dim=QK_DIM,
            block_size=64,
            topk=2048,
        ),
        reference_validate=lambda spec: _validate(spec, needs_format=True),
    ),
    OpContract(
        name="sparse_mla.prefill",
        summary="absorbed MLA over top-k rows of a gathered workspace (flash_mla_sparse_fwd)",
        reference=prefill,
        default_spec=OpSpec(
            op="sparse_mla.prefill", dtype="bfloat16", num_heads=128, head_dim=QK_DIM, topk=2048
        ),
        reference_validate=lambda spec: _validate(spec, needs_format=False),
    ),
]
