"""AITER adapters for the DSA indexer: logits (ragged and paged), top-k, index-key writes.

Not validated on hardware: each convention below is read from AITER's public source and tested
here against a fake ``aiter`` that implements it with torch (plugins/amd/tests/fake_aiter.py).

- ``fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends)`` (ragged): fp8 queries (the
  contract's query scale folded into the weights, as for DeepGEMM), keys ``[N, 128]`` and one
  fp32 scale per key; its rows are views of a buffer padded to 256 columns. On gfx942 the
  matrix units read every fp8 operand as FNUZ, so the adapter converts hwrun's e4m3fn codes of
  queries and keys at its boundary (:func:`hwrun.formats.e4m3fnuz.fnuz_from_e4m3fn`: the same
  bits at half the value) and multiplies the key scales by 4; it passes FNUZ-typed tensors, so
  an AITER release that converts by itself does not convert again.
- ``deepgemm_fp8_paged_mqa_logits(q [B, next_n, H, D], kv_cache [blocks, block, 1, 132], weights,
  out_logits, context_lens, kv_indices, max_model_len, Preshuffle, KVBlockSize)`` (paged): the
  cache's block layout is hwrun's (a block's 128-byte keys, then its fp32 scales), read in place
  without the 16x16 pre-shuffle. ``next_n`` rows share a request's length with a causal offset;
  the contract gives every row its own length, so the adapter passes each row as a request of
  its own (``next_n = 1``, the block table repeated per row). Positions at and past a row's
  length are not written: the adapter writes -inf there. gfx942 is refused: the cache holds
  e4m3fn codes and is read in place as FNUZ. The function moved from ``aiter.ops.triton`` to
  ``aiter.ops.triton.attention`` in January 2026; both paths are accepted.
- ``top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1,
  k)`` writes column indices of the logits row (``i + rowStart``) and -1 past a short row; the
  contract wants them relative to the row's start. ``top_k_per_row_decode(logits, next_n,
  seqLens, ...)`` reads rows from column 0 with length ``seqLens[r // next_n] - next_n + r %
  next_n + 1``: with ``next_n = 1`` and ``seqLens = ends`` that is each row's own length. The
  adapter takes the decode kernel when every row starts at 0 (a host read of ``starts``).
  Logits must be fp32 with unit column stride (``stride1`` is ignored by the kernels).
- ``indexer_k_quant_and_cache(k, kv_cache [blocks, block, 132], slot_mapping int64,
  quant_block_size, scale_fmt)``: one fp32 scale per 128 (``quant_block_size = 128``),
  ``scale_fmt = "ue8m0"`` (hwrun's fp8 key rule), no pre-shuffle, slots < 0 skipped. It scales
  by the reciprocal (exact for a power-of-two scale) and computes the ceiling with ``log2f``
  (one binade low when the raw scale lies within rounding of a power of two; hwrun's rule is
  the exact ceiling): conformance on hardware decides. gfx942 is refused: there the cache type
  is FNUZ, so AITER writes FNUZ codes scaled to 240, not hwrun's e4m3fn bytes. It addresses
  a block as ``block * block_size * stride``, so a strided (packed) cache view is refused.
"""

from __future__ import annotations

import torch

from hwrun.formats.e4m3fnuz import fnuz_from_e4m3fn
from hwrun.formats.index_keys import INDEX_DIM, get_index_key_format
from hwrun.registry import OpSpec, dtype_reasons, format_reasons
from hwrun_amd.aiter_library import aiter_function
from hwrun_amd.device_checks import (
    FNUZ_FP8_ARCHS,
    arch_reasons,
    device_arch,
    rocm_reasons,
)

AITER_ARCHS = ("gfx942", "gfx950")
OCP_FP8_ARCHS = ("gfx950",)  # where AITER's fp8 cache reads and writes are e4m3fn
FP8_KEY_BYTES = get_index_key_format("fp8").bytes_per_token  # 132
PAGED_CHUNK_K = 256  # deepgemm_fp8_paged_mqa_logits' default ChunkK
FP8_KEY_SCALE_FORMAT = "ue8m0"  # hwrun's fp8 index-key scale rule


def _ragged_fn():
    return aiter_function(
        "aiter.ops.triton.attention.fp8_mqa_logits:fp8_mqa_logits",
        "aiter.ops.triton.fp8_mqa_logits:fp8_mqa_logits",
    )


def _paged_fn():
    return aiter_function(
        "aiter.ops.triton.attention.pa_mqa_logits:deepgemm_fp8_paged_mqa_logits",
        "aiter.ops.triton.pa_mqa_logits:deepgemm_fp8_paged_mqa_logits",
    )


def to_fnuz(codes: torch.Tensor) -> torch.Tensor:  # [...] e4m3fn codes -> [...] fnuz, half value
    """hwrun's e4m3fn codes as the FNUZ tensor gfx942 reads, at half their value."""
    return fnuz_from_e4m3fn(codes.contiguous().view(torch.uint8)).view(torch.float8_e4m3fnuz)


def _outside_rows(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(logits.shape[1], device=logits.device)
    return logits.masked_fill((pos < starts[:, None]) | (pos >= ends[:, None]), float("-inf"))


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, 128] uint8 e4m3fn
    key_scales: torch.Tensor,  # [N, 4] uint8, one fp32 each
    fmt: str,
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    if fmt != "fp8" or q.dtype != torch.float8_e4m3fn:
        raise ValueError(
            f"AITER fp8_mqa_logits takes fp8 keys and fp8 queries, got {fmt} {q.dtype}"
        )
    n = key_elements.shape[0]
    keys = key_elements.contiguous().view(torch.float8_e4m3fn)
    scales = key_scales.contiguous().view(torch.float32).reshape(n)
    if device_arch(q) in FNUZ_FP8_ARCHS:
        q, keys, scales = to_fnuz(q), to_fnuz(keys), scales * 4.0  # both operands halved
    starts, ends = ks.to(torch.int32).contiguous(), ke.to(torch.int32).contiguous()
    logits = _ragged_fn()(q.contiguous(), keys, scales, weights.float().contiguous(), starts, ends)
    return _outside_rows(logits[:, :n], starts, ends)


def logits_paged(
    q: torch.Tensor,  # [B, n, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * 132] uint8
    fmt: str,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf at and past each row's length
    if fmt != "fp8" or q.dtype != torch.float8_e4m3fn:
        raise ValueError(
            f"AITER paged MQA logits take fp8 keys and fp8 queries, got {fmt} {q.dtype}"
        )
    if device_arch(q) in FNUZ_FP8_ARCHS:
        raise ValueError(
            "AITER paged MQA logits read the e4m3fn cache in place as FNUZ on gfx942; "
            "use the Triton tier or the ragged path there"
        )
    batch, rows_per_request, heads, dim = q.shape
    rows = batch * rows_per_request
    block_size = cache.shape[1] // FP8_KEY_BYTES
    shape = (cache.shape[0], block_size, 1, FP8_KEY_BYTES)  # blocks may be strided (packed)
    kv_cache = cache.as_strided(shape, (cache.stride(0), FP8_KEY_BYTES, FP8_KEY_BYTES, 1))
    lens = context_lens.reshape(rows).to(torch.int32).contiguous()
    table = block_table.to(torch.int32).repeat_interleave(rows_per_request, dim=0).contiguous()
    out = torch.full((rows, max_ctx), float("-inf"), dtype=torch.float32, device=q.device)
    _paged_fn()(
        q.reshape(rows, 1, heads, dim).contiguous(),
        kv_cache,
        weights.float().contiguous(),
        out,
        lens,
        table,
        max_ctx,
        Preshuffle=False,
        KVBlockSize=block_size,
    )
    past = torch.arange(max_ctx, device=q.device)[None, :] >= lens[:, None]
    return out.masked_fill(past, float("-inf"))


def relative_to_starts(indices: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """AITER's column indices (``i + rowStart``) as the contract's, relative to the start."""
    return torch.where(indices >= 0, indices - starts[:, None], indices)


def topk(
    logits: torch.Tensor,  # [R, L] float32
    starts: torch.Tensor,  # [R] int32
    ends: torch.Tensor,  # [R] int32
    k: int,
) -> torch.Tensor:  # [R, k] int32, relative to each row's start, -1 past a short row
    import aiter

    if logits.dtype != torch.float32:
        raise ValueError(f"AITER top_k_per_row reads fp32 logits, got {logits.dtype}")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows = logits.shape[0]
    indices = torch.empty(rows, k, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return indices
    starts = starts.to(torch.int32).contiguous()
    ends = ends.to(torch.int32).contiguous()
    stride0, stride1 = logits.stride()
    if not bool(starts.any()):  # every row from column 0: the one-block decode kernel
        aiter.top_k_per_row_decode(logits, 1, ends, indices, rows, stride0, stride1, k)
        return indices
    aiter.top_k_per_row_prefill(logits, starts, ends, indices, None, rows, stride0, stride1, k)
    return relative_to_starts(indices, starts)


def write_index_keys(
    cache: torch.Tensor,  # [num_blocks, block_size * 132] uint8
    keys: torch.Tensor,  # [T, 128]
    slots: torch.Tensor,  # [T] int32, < 0 skipped
    fmt: str,
) -> None:
    import aiter

    if fmt != "fp8":
        raise ValueError(f"AITER indexer_k_quant_and_cache writes fp8 keys only, got {fmt!r}")
    if device_arch(keys) in FNUZ_FP8_ARCHS:
        raise ValueError("AITER writes FNUZ index keys on gfx942, not hwrun's e4m3fn bytes")
    block_size = cache.shape[1] // FP8_KEY_BYTES
    if cache.stride(0) != block_size * FP8_KEY_BYTES or cache.stride(1) != 1:
        raise ValueError(
            "AITER's indexer_k_quant_and_cache addresses a block by its size: it needs a "
            f"contiguous [num_blocks, block_size * {FP8_KEY_BYTES}] cache, got strides "
            f"{cache.stride()} (a packed layout's view); use the Triton tier's writer"
        )
    kv_cache = cache.view(cache.shape[0], block_size, FP8_KEY_BYTES)
    aiter.indexer_k_quant_and_cache(
        keys.contiguous(),
        kv_cache,
        slots.to(torch.int64).contiguous(),
        INDEX_DIM,
        FP8_KEY_SCALE_FORMAT,
    )


def _logits_reasons(spec: OpSpec, paged: bool) -> list[str]:
    archs = OCP_FP8_ARCHS if paged else AITER_ARCHS
    what = "AITER's paged MQA logits (the cache is read in place)" if paged else "AITER"
    reasons = rocm_reasons(spec) + arch_reasons(spec, archs, what)
    reasons += format_reasons(spec, ("fp8",), "index-key")
    reasons += dtype_reasons(spec, ("float8_e4m3fn",), "query")
    heads = spec.num_heads
    if heads is not None and (heads < 1 or heads & (heads - 1)):
        reasons.append(f"AITER's fp8 MQA logits need a power-of-two head count, got {heads}")
    if spec.head_dim not in (None, INDEX_DIM):
        reasons.append(f"AITER's fp8 MQA logits read {INDEX_DIM}-dim keys, got {spec.head_dim}")
    bs = spec.block_size
    if paged and bs is not None and PAGED_CHUNK_K % bs and bs % PAGED_CHUNK_K:
        reasons.append(
            f"AITER's paged MQA logits need a block size dividing {PAGED_CHUNK_K} or a multiple "
            f"of it, got {bs}"
        )
    return reasons


def _topk_reasons(spec: OpSpec) -> list[str]:
    reasons = rocm_reasons(spec) + arch_reasons(spec, AITER_ARCHS, "AITER top_k_per_row")
    return reasons + dtype_reasons(spec, ("float32",), "logits")


def _write_reasons(spec: OpSpec) -> list[str]:
    what = "AITER's indexer_k_quant_and_cache (it writes the cache's fp8 type)"
    reasons = rocm_reasons(spec) + arch_reasons(spec, OCP_FP8_ARCHS, what)
    reasons += format_reasons(spec, ("fp8",), "index-key")
    return reasons + dtype_reasons(spec, ("bfloat16", "float16", "float32"), "input")


ADAPTERS = (
    ("indexer.logits_ragged", logits_ragged, lambda s: _logits_reasons(s, paged=False),
     "AITER fp8_mqa_logits (fp8 q and keys; FNUZ converted at the boundary on gfx942)"),
    ("indexer.logits_paged", logits_paged, lambda s: _logits_reasons(s, paged=True),
     "AITER deepgemm_fp8_paged_mqa_logits (fp8 q and keys, gfx950)"),
    ("indexer.topk", topk, _topk_reasons,
     "AITER top_k_per_row_prefill / _decode (decode kernel when every row starts at 0)"),
    ("kv.write_index_keys", write_index_keys, _write_reasons,
     "AITER indexer_k_quant_and_cache (fp8 keys, ue8m0 scale, gfx950)"),
)  # fmt: skip
