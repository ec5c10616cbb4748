"""Reference cache writes (`kv.write_latent`, `kv.write_index_keys`): quantize, scatter to slots.

Both encode through ``hwrun.formats`` (the byte layouts are specified in docs/formats.md), so
what a plugin writes is compared byte for byte. Slot ``x`` is row ``x % block_size`` of block
``x // block_size``; a negative slot (vLLM's padding) is skipped; a slot past the cache, or the
same slot twice in one call (the winner would be up to the kernel), raises ValueError. Rows not
named by a slot are left untouched.
"""

from __future__ import annotations

import torch

from hwrun.formats.index_keys import INDEX_KEY_FORMATS, get_index_key_format
from hwrun.formats.latent import LATENT_FORMATS, get_latent_format
from hwrun.ops.contract import OpContract
from hwrun.registry import OpSpec

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT_DTYPES = (torch.int32, torch.int64)


def _checked_slots(slots: torch.Tensor, tokens: int, capacity: int) -> torch.Tensor:
    """The valid (non-negative) positions' mask, after checking range and uniqueness."""
    if slots.dtype not in _INT_DTYPES or slots.shape != (tokens,):
        raise ValueError(f"slots must be int32 [T={tokens}], got {slots.dtype} {list(slots.shape)}")
    valid = slots >= 0
    if bool((slots >= capacity).any()):
        raise ValueError(
            f"slots must be < {capacity} (num_blocks * block_size); got max {int(slots.max())}"
        )
    kept = slots[valid]
    if kept.unique().numel() != kept.numel():
        raise ValueError("each slot may be written at most once per call; got a repeated slot")
    return valid


def _check_rows(name: str, t: torch.Tensor, width: int, tokens: int | None = None) -> None:
    if t.dtype not in _FLOAT_DTYPES or t.dim() != 2 or t.shape[1] != width:
        raise ValueError(
            f"{name} must be a float [T, {width}] tensor, got {t.dtype} {list(t.shape)}"
        )
    if tokens is not None and t.shape[0] != tokens:
        raise ValueError(f"{name} must have T={tokens} rows, got {t.shape[0]}")


def write_latent(
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8 (may be a strided view)
    nope: torch.Tensor,  # [T, 512] bfloat16, the latent part
    rope: torch.Tensor,  # [T, 64] bfloat16, the RoPE part
    slots: torch.Tensor,  # [T] int32, -1 (any negative) = skip
    fmt: str,  # latent format: "bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"
    scale: float | None = None,  # per-tensor scale of fp8_e4m3 only
) -> None:
    """Encode each token's latent row in ``fmt`` and store it at its slot, in place."""
    latent = get_latent_format(fmt)
    _check_rows("nope", nope, 512)
    _check_rows("rope", rope, 64, nope.shape[0])
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != latent.row_bytes:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size, {latent.row_bytes}] for {fmt!r}, got "
            f"{cache.dtype} {list(cache.shape)}"
        )
    block_size = cache.shape[1]
    valid = _checked_slots(slots, nope.shape[0], cache.shape[0] * block_size)
    if not bool(valid.any()):
        return
    rows = latent.encode(nope[valid], rope[valid], scale)  # [T', row_bytes] uint8
    kept = slots[valid].long()
    cache[kept // block_size, kept % block_size] = rows


def write_index_keys(
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8 (may be strided)
    keys: torch.Tensor,  # [T, 128] bfloat16
    slots: torch.Tensor,  # [T] int32, -1 (any negative) = skip
    fmt: str,  # index-key format: "bf16", "fp8", "mxfp4"
) -> None:
    """Encode each token's index key in ``fmt`` and store it in its block-major page, in place.

    A page holds all element rows of the block, then all scale rows (DeepGEMM's paged layout);
    the block size is ``cache.shape[1] // bytes_per_token``.
    """
    key_format = get_index_key_format(fmt)
    _check_rows("keys", keys, 128)
    bpt = key_format.bytes_per_token
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] % bpt != 0:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size * {bpt}] for {fmt!r}, got "
            f"{cache.dtype} {list(cache.shape)}"
        )
    block_size = cache.shape[1] // bpt
    valid = _checked_slots(slots, keys.shape[0], cache.shape[0] * block_size)
    if not bool(valid.any()):
        return
    elements, scales = key_format.encode(keys[valid])
    element_pages, scale_pages = key_format.split_pages(cache, block_size)  # views into cache
    kept = slots[valid].long()
    element_pages[kept // block_size, kept % block_size] = elements
    if key_format.scale_bytes:
        scale_pages[kept // block_size, kept % block_size] = scales


def _validate(spec: OpSpec, known: dict) -> list[str]:
    unknown = [f for f in spec.formats if f not in known]
    if unknown:
        return [f"unknown format(s) {unknown}; known: {sorted(known)}"]
    if spec.dtype is not None and spec.dtype not in ("bfloat16", "float16", "float32"):
        return [f"inputs must be bfloat16, float16 or float32, got {spec.dtype}"]
    return []


CONTRACTS: list[OpContract] = [
    OpContract(
        name="kv.write_latent",
        summary="encode latent + RoPE rows in the layer's latent format and scatter to slots",
        reference=write_latent,
        default_spec=OpSpec(
            op="kv.write_latent", dtype="bfloat16", formats=("fp8_ds_mla",), block_size=64
        ),
        reference_validate=lambda spec: _validate(spec, LATENT_FORMATS),
    ),
    OpContract(
        name="kv.write_index_keys",
        summary="encode index keys (bf16 / fp8 / mxfp4) and scatter into block-major pages",
        reference=write_index_keys,
        default_spec=OpSpec(
            op="kv.write_index_keys",
            dtype="bfloat16",
            formats=("fp8",),
            head_dim=128,
            block_size=64,
        ),
        reference_validate=lambda spec: _validate(spec, INDEX_KEY_FORMATS),
    ),
]
