"""Reference DSA indexer scores (`indexer.logits_ragged`, `indexer.logits_paged`).

The score of query row ``i`` for key ``j`` (DeepGEMM's ``fp8_mqa_logits`` /
``fp8_paged_mqa_logits`` meaning)::

    out[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j])

with ``k`` decoded from its index-key format (``k = codes * k_scale``: bf16, fp8 or mxfp4) and
everything in fp32. Keys outside a row's range are -inf. The softmax scale and the
``H ** -0.5`` of the models are part of ``w`` (as in vLLM and transformers). An FP8 query comes
as ``torch.float8_e4m3fn`` codes with a per-(token, head) scale that :func:`fold_q_scale` folds
into ``w`` (the scale is positive, so it commutes with the ReLU).

Each row is computed on its own, so its scores never depend on the other rows of the call.
"""

from __future__ import annotations

import torch

from hwrun.formats.index_keys import INDEX_KEY_FORMATS, get_index_key_format
from hwrun.ops.contract import OpContract
from hwrun.registry import OpSpec

INDEX_HEAD_DIM = 128
_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)
_INT_DTYPES = (torch.int32, torch.int64)


def fold_q_scale(
    q_scale: torch.Tensor,  # [..., H] float32, per-(token, head) scale of an fp8 query
    weights: torch.Tensor,  # [..., H] float32, per-head weights of the same rows
) -> torch.Tensor:  # [..., H] float32 weights to use with the fp8 query codes
    """Fold an fp8 query's per-(token, head) scale into the head weights: ``w * q_scale``.

    With ``q = codes * q_scale`` (``q_scale > 0``), ``w * relu(q . k) ==
    (w * q_scale) * relu(codes . k)``, so the logits ops take the codes and the folded weights.
    """
    if q_scale.shape != weights.shape:
        raise ValueError(
            f"q_scale and weights must have the same shape [..., H], got "
            f"{list(q_scale.shape)} and {list(weights.shape)}"
        )
    if bool((q_scale.float() <= 0).any()):
        raise ValueError("q_scale must be positive (a zero or negative scale cannot pass the ReLU)")
    return weights.float() * q_scale.float()


def next_n_context_lens(
    context_lens: torch.Tensor,  # [B] int32, tokens in each request's cache incl. the n new ones
    next_n: int,
) -> torch.Tensor:  # [B, n] int32, the length row j of request b sees
    """Per-row lengths for speculative verification (DeepGEMM's 1-D ``context_lens`` form).

    The ``n`` query rows of a request are its last ``n`` tokens, each causal: row ``j`` sees
    ``context_lens[b] - n + 1 + j`` keys (the last row sees them all).
    """
    if not isinstance(next_n, int) or next_n <= 0:
        raise ValueError(f"next_n must be a positive int, got {next_n!r}")
    if context_lens.dim() != 1 or context_lens.dtype not in _INT_DTYPES:
        raise ValueError(
            f"context_lens must be int32 [B], got {context_lens.dtype} {list(context_lens.shape)}"
        )
    if bool((context_lens < next_n).any()):
        raise ValueError(f"every context must hold at least next_n={next_n} tokens")
    offsets = torch.arange(next_n, device=context_lens.device) - (next_n - 1)
    return (context_lens.long()[:, None] + offsets).to(torch.int32)


def _row_scores(
    q: torch.Tensor,  # [H, D] float32
    w: torch.Tensor,  # [H] float32
    keys: torch.Tensor,  # [n, D] float32
) -> torch.Tensor:  # [n] float32
    # Fresh contiguous copies: the same bits whatever batch, layout or offset the row came from.
    q, w, keys = (x.clone(memory_format=torch.contiguous_format) for x in (q, w, keys))
    dots = torch.relu(q @ keys.T)  # [H, n]
    return (w[:, None] * dots).sum(dim=0)


def _check_q_w(q: torch.Tensor, weights: torch.Tensor, rows: int, heads: int) -> None:
    if q.dtype not in _Q_DTYPES:
        raise ValueError(f"q must be bfloat16, float16, float32 or float8_e4m3fn, got {q.dtype}")
    if q.shape[-1] != INDEX_HEAD_DIM:
        raise ValueError(
            f"q's head dim must be {INDEX_HEAD_DIM} (the index-key formats), got {q.shape[-1]}"
        )
    if weights.dtype != torch.float32 or weights.shape != (rows, heads):
        raise ValueError(
            f"weights must be float32 [{rows}, {heads}], got {weights.dtype} {list(weights.shape)}"
        )


def logits_ragged(
    q: torch.Tensor,  # [M, H, D] bfloat16 or float8_e4m3fn codes
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, element_bytes] uint8
    key_scales: torch.Tensor,  # [N, scale_bytes] uint8
    fmt: str,  # index-key format: "bf16", "fp8", "mxfp4"
    ks: torch.Tensor,  # [M] int32, first key of each row
    ke: torch.Tensor,  # [M] int32, one past the last key of each row
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    """Indexer scores of prefill rows against a contiguous run of keys (``fp8_mqa_logits``).

    ``0 <= ks[i] <= ke[i] <= N`` is required; an empty range gives a row of -inf.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [M, H, D], got {list(q.shape)}")
    rows, heads, _ = q.shape
    _check_q_w(q, weights, rows, heads)
    key_format = get_index_key_format(fmt)
    num_keys = key_elements.shape[0] if key_elements.dim() == 2 else -1
    if key_elements.dtype != torch.uint8 or key_elements.shape != (
        num_keys,
        key_format.element_bytes,
    ):
        raise ValueError(
            f"key_elements must be uint8 [N, {key_format.element_bytes}] for {fmt!r}, got "
            f"{key_elements.dtype} {list(key_elements.shape)}"
        )
    if key_scales.dtype != torch.uint8 or key_scales.shape != (num_keys, key_format.scale_bytes):
        raise ValueError(
            f"key_scales must be uint8 [N={num_keys}, {key_format.scale_bytes}] for {fmt!r}, got "
            f"{key_scales.dtype} {list(key_scales.shape)}"
        )
    for name, t in (("ks", ks), ("ke", ke)):
        if t.dtype not in _INT_DTYPES or t.shape != (rows,):
            raise ValueError(f"{name} must be int32 [M={rows}], got {t.dtype} {list(t.shape)}")
    starts, ends = ks.tolist(), ke.tolist()
    if any(not 0 <= s <= e <= num_keys for s, e in zip(starts, ends, strict=True)):
        raise ValueError(
            f"every row needs 0 <= ks <= ke <= N={num_keys}; got ks={starts}, ke={ends}"
        )
    out = torch.full((rows, num_keys), float("-inf"), dtype=torch.float32, device=q.device)
    if num_keys == 0:
        return out
    keys = key_format.decode(key_elements, key_scales)  # [N, D] float32, row by row
    qf, wf = q.float(), weights
    for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
        if e > s:
            out[i, s:e] = _row_scores(qf[i], wf[i], keys[s:e])
    return out


def logits_paged(
    q: torch.Tensor,  # [B, n, H, D] bfloat16 or float8_e4m3fn codes
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8, block-major pages
    fmt: str,  # index-key format: "bf16", "fp8", "mxfp4"
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32, keys row (b, j) sees (next_n_context_lens)
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf at and past each row's length
    """Indexer scores of decode rows against each request's paged keys (``fp8_paged_mqa_logits``).

    Row ``b * n + j`` scores tokens ``0 .. context_lens[b, j] - 1`` of request ``b`` (token
    ``t`` lives in block ``block_table[b, t // block_size]``, row ``t % block_size``); the rest
    of the row is -inf. This is DeepGEMM's 2-D ``context_lens`` form; build it from per-request
    lengths with :func:`next_n_context_lens`.
    """
    if q.dim() != 4:
        raise ValueError(f"q must be [B, n, H, D], got {list(q.shape)}")
    batch, next_n, heads, _ = q.shape
    _check_q_w(q, weights, batch * next_n, heads)
    key_format = get_index_key_format(fmt)
    bpt = key_format.bytes_per_token
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] % bpt != 0:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size * {bpt}] for {fmt!r}, got "
            f"{cache.dtype} {list(cache.shape)}"
        )
    block_size = cache.shape[1] // bpt
    if (
        block_table.dtype not in _INT_DTYPES
        or block_table.dim() != 2
        or block_table.shape[0] != batch
    ):
        raise ValueError(
            f"block_table must be int32 [B={batch}, max_blocks], got {block_table.dtype} "
            f"{list(block_table.shape)}"
        )
    if context_lens.dtype not in _INT_DTYPES or context_lens.shape != (batch, next_n):
        raise ValueError(
            f"context_lens must be int32 [B={batch}, n={next_n}] (see next_n_context_lens), got "
            f"{context_lens.dtype} {list(context_lens.shape)}"
        )
    if not isinstance(max_ctx, int) or max_ctx < 0:
        raise ValueError(f"max_ctx must be a non-negative int, got {max_ctx!r}")
    capacity = block_table.shape[1] * block_size
    lens = context_lens.tolist()
    for b, row_lens in enumerate(lens):
        if any(not 0 <= n <= min(max_ctx, capacity) for n in row_lens):
            raise ValueError(
                f"request {b}: context_lens {row_lens} must lie in [0, min(max_ctx={max_ctx}, "
                f"max_blocks * block_size={capacity})]"
            )
    elements, scales = key_format.split_pages(cache, block_size)
    out = torch.full((batch * next_n, max_ctx), float("-inf"), dtype=torch.float32, device=q.device)
    qf = q.float()
    for b, row_lens in enumerate(lens):
        longest = max(row_lens)
        if longest == 0:
            continue
        tokens = torch.arange(longest, device=cache.device)
        blocks = block_table[b].long()[tokens // block_size]
        if bool((blocks < 0).any()):
            raise ValueError(
                f"request {b}: its context reaches an unallocated block-table entry (< 0)"
            )
        offsets = tokens % block_size
        keys = key_format.decode(elements[blocks, offsets], scales[blocks, offsets])
        for j, length in enumerate(row_lens):
            if length:
                row = b * next_n + j
                out[row, :length] = _row_scores(qf[b, j], weights[row], keys[:length])
    return out


def _validate(spec: OpSpec) -> list[str]:
    reasons = []
    if spec.head_dim is not None and spec.head_dim != INDEX_HEAD_DIM:
        reasons.append(f"head_dim must be {INDEX_HEAD_DIM}, got {spec.head_dim}")
    if spec.dtype is not None and spec.dtype not in (
        "bfloat16",
        "float16",
        "float32",
        "float8_e4m3fn",
    ):
        reasons.append(f"q must be bfloat16, float16, float32 or float8_e4m3fn, got {spec.dtype}")
    unknown = [f for f in spec.formats if f not in INDEX_KEY_FORMATS]
    if unknown:
        reasons.append(f"unknown index-key format(s) {unknown}; known: {sorted(INDEX_KEY_FORMATS)}")
    return reasons


_SPEC = {"dtype": "float8_e4m3fn", "formats": ("fp8",), "num_heads": 64, "head_dim": INDEX_HEAD_DIM}
CONTRACTS: list[OpContract] = [
    OpContract(
        name="indexer.logits_ragged",
        summary="sum_h w * relu(q . k) over each prefill row's key range (DeepGEMM fp8_mqa_logits)",
        reference=logits_ragged,
        default_spec=OpSpec(op="indexer.logits_ragged", **_SPEC),
        reference_validate=_validate,
    ),
    OpContract(
        name="indexer.logits_paged",
        summary="sum_h w * relu(q . k) over each decode row's paged keys (fp8_paged_mqa_logits)",
        reference=logits_paged,
        default_spec=OpSpec(op="indexer.logits_paged", block_size=64, **_SPEC),
        reference_validate=_validate,
    ),
]
