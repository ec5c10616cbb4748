"""AITER adapter for sparse MLA decode: ``aiter.mla.mla_decode_fwd`` over the top-k as a page
list (ROCm's ROCM_AITER_MLA_SPARSE path in vLLM).

Not validated on hardware; the conventions below are tested against a fake ``aiter``
(plugins/amd/tests/fake_aiter.py).

- Each query token is a request of its own: ``qo_indptr = 0, 1, ..., R``, and its valid slots
  (``slot >= 0`` and before ``topk_length``) are its pages, concatenated in ``kv_indices`` with
  ``kv_indptr`` their running count; pages are single tokens (``page_size = 1``,
  ``kv_last_page_lens`` all 1). A slot of hwrun's paged cache becomes a page index of a
  one-row-per-page view of the same memory: ``block * (block_stride / row_bytes) + row``, so a
  packed (strided) cache is read in place when its block stride is a whole number of rows.
- The cache is hwrun's ``bf16`` latent (576 bf16 per token, the first 512 the value), read as
  ``kv_buffer [pages, 1, 1, 576]``; q is bf16 ``[R, H, 576]``. Other latent formats are refused:
  ``fp8_ds_mla``'s 656-byte rows (V3.2's) and ``nvfp4_ds_mla`` are layouts AITER does not read;
  its fp8 path (``fp8_e4m3`` with q in fp8) is not adapted here.
- The MLA kernels need the head count to be a multiple of 16: TP8 of a 128-head model gives 8
  heads per GPU, padded to 16 with zero queries whose outputs are dropped.
- ``return_lse=True`` gives the LSE ``[R, H]`` in natural log (the reduce combines splits with
  ``exp`` / ``log``), as the contract's. A row with no valid slot is left to the kernel's
  arithmetic (0 / 0); the adapter writes the contract's out 0 and lse -inf there.
- No attention sink: a call with ``attn_sink`` is refused.
"""

from __future__ import annotations

import torch

from hwrun.formats.latent import get_latent_format
from hwrun.registry import OpSpec, dtype_reasons
from hwrun_amd.aiter_library import aiter_function
from hwrun_amd.device_checks import arch_reasons, rocm_reasons

AITER_MLA_ARCHS = ("gfx942", "gfx950")
HEAD_MULTIPLE = 16  # AITER's MLA decode kernels take heads in multiples of 16
LATENT = get_latent_format("bf16")
LATENT_DIM = 576
VALUE_DIM = 512


def padded_heads(heads: int) -> int:
    return -(-heads // HEAD_MULTIPLE) * HEAD_MULTIPLE


def page_view(cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The cache as AITER's ``[pages, 1, 1, 576]`` bf16 pages of one token, and how many
    pages one block advances by."""
    blocks, block_size, row_bytes = cache.shape
    if cache.stride(2) != 1 or cache.stride(1) != row_bytes or cache.stride(0) % row_bytes:
        raise ValueError(
            "AITER's MLA decode reads one-token pages: each block's rows must be contiguous and "
            f"the block stride a whole number of {row_bytes}-byte rows, got strides "
            f"{cache.stride()}"
        )
    rows_per_block = cache.stride(0) // row_bytes
    pages = (blocks - 1) * rows_per_block + block_size
    values = cache.view(torch.bfloat16)  # [blocks, block_size, 576]
    kv = values.as_strided(
        (pages, 1, 1, LATENT_DIM),
        (LATENT_DIM, LATENT_DIM, LATENT_DIM, 1),
        values.storage_offset(),
    )
    return kv, rows_per_block


def page_lists(
    slots: torch.Tensor,  # [R, k] int physical slots, -1 invalid
    topk_length: torch.Tensor | None,  # [R]
    block_size: int,
    rows_per_block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # kv_indptr [R+1], kv_indices, valid [R, k]
    """Each row's valid slots as page indices, concatenated (AITER's indptr / indices)."""
    slots = slots.long()
    valid = slots >= 0
    if topk_length is not None:
        position = torch.arange(slots.shape[1], device=slots.device)
        valid &= position[None, :] < topk_length.reshape(-1, 1).long()
    pages = (slots // block_size) * rows_per_block + slots % block_size
    indptr = torch.zeros(slots.shape[0] + 1, dtype=torch.int32, device=slots.device)
    indptr[1:] = valid.sum(1).cumsum(0)
    return indptr, pages[valid].to(torch.int32), valid


def empty_rows_to_contract(
    out: torch.Tensor,  # [R, H, 512]
    lse: torch.Tensor,  # [R, H]
    valid: torch.Tensor,  # [R, k]
) -> tuple[torch.Tensor, torch.Tensor]:
    empty = ~valid.any(1)
    return (
        out.masked_fill(empty[:, None, None], 0.0),
        lse.masked_fill(empty[:, None], float("-inf")),
    )


def decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, 1152] uint8, bf16 latent rows
    fmt: str,
    slots: torch.Tensor,  # [B, s, k] int32, -1 invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
    latent_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512] q.dtype, lse [B, s, H] float32
    if fmt != LATENT.name or latent_scale is not None:
        raise ValueError(f"AITER's MLA decode adapter reads bf16 latent rows only, got {fmt!r}")
    if attn_sink is not None:
        raise ValueError("AITER's mla_decode_fwd has no attention sink; use the Triton tier")
    batch, next_n, heads, _ = q.shape
    rows = batch * next_n
    kv, rows_per_block = page_view(cache)
    indptr, indices, valid = page_lists(
        slots.reshape(rows, -1), topk_length, cache.shape[1], rows_per_block
    )
    padded = padded_heads(heads)
    q_rows = torch.zeros(rows, padded, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    q_rows[:, :heads] = q.reshape(rows, heads, LATENT_DIM)
    out = torch.empty(rows, padded, VALUE_DIM, dtype=torch.bfloat16, device=q.device)
    mla_decode_fwd = aiter_function("aiter.mla:mla_decode_fwd")
    result, lse = mla_decode_fwd(
        q_rows,
        kv,
        out,
        torch.arange(rows + 1, dtype=torch.int32, device=q.device),
        indptr,
        indices,
        torch.ones(rows, dtype=torch.int32, device=q.device),
        1,
        page_size=1,
        nhead_kv=1,
        sm_scale=float(softmax_scale),
        return_lse=True,
    )
    result = result.reshape(rows, padded, VALUE_DIM)[:, :heads]
    lse = lse.reshape(rows, padded)[:, :heads].float()
    result, lse = empty_rows_to_contract(result, lse, valid)
    return (
        result.to(q.dtype).reshape(batch, next_n, heads, VALUE_DIM),
        lse.reshape(batch, next_n, heads),
    )


def _validate(spec: OpSpec) -> list[str]:
    reasons = rocm_reasons(spec) + arch_reasons(spec, AITER_MLA_ARCHS, "AITER's MLA decode")
    reasons += dtype_reasons(spec, ("bfloat16",), "query")
    other = [f for f in spec.formats if f != LATENT.name]
    if other:
        reasons.append(
            f"latent format(s) {other}: the AITER MLA adapter reads bf16 latent rows only "
            "(fp8_ds_mla's 656-byte rows and nvfp4_ds_mla are layouts AITER does not read; "
            "its fp8_e4m3 path is not adapted)"
        )
    if spec.head_dim not in (None, LATENT_DIM):
        reasons.append(f"AITER's MLA decode needs head_dim {LATENT_DIM}, got {spec.head_dim}")
    return reasons


ADAPTERS = (
    ("sparse_mla.decode", decode, _validate,
     "AITER mla_decode_fwd over the top-k as one-token pages (bf16 latent, heads padded to 16)"),
)  # fmt: skip
