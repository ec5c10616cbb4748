"""The TPU plugin's Pallas kernels, one entry per op: the host function (which imports its
kernel module, and so JAX, at the first call) and the kernel's limits, whatever the device.

The kernels' modules: :mod:`.kv_write`, :mod:`.indexer`, :mod:`.topk`, :mod:`.gather` with
:mod:`.sparse_mla`, :mod:`.attn`.
"""

from __future__ import annotations

from typing import Any

from hwrun.formats.latent import get_latent_format
from hwrun.registry import OpSpec, dtype_reasons, format_reasons
from hwrun_tpu.tier import PallasKernel

# Kept in step with the modules' own tuples (importing those would import JAX).
INDEX_KEY_FORMATS = ("fp8", "bf16")
LATENT_FORMATS = ("fp8_ds_mla", "bf16")
QUERY_DTYPES = ("bfloat16", "float32", "float8_e4m3fn")
INPUT_DTYPES = ("bfloat16", "float16", "float32")


def _logits_paged(*args: Any, **kwargs: Any):
    from hwrun_tpu.indexer import logits_paged

    return logits_paged(*args, **kwargs)


def _logits_ragged(*args: Any, **kwargs: Any):
    from hwrun_tpu.indexer import logits_ragged

    return logits_ragged(*args, **kwargs)


def _topk(*args: Any, **kwargs: Any):
    from hwrun_tpu.topk import topk

    return topk(*args, **kwargs)


def _decode(*args: Any, **kwargs: Any):
    from hwrun_tpu.sparse_mla import decode

    return decode(*args, **kwargs)


def _prefill(*args: Any, **kwargs: Any):
    from hwrun_tpu.sparse_mla import prefill

    return prefill(*args, **kwargs)


def _lse_combine(*args: Any, **kwargs: Any):
    from hwrun_tpu.attn import lse_combine

    return lse_combine(*args, **kwargs)


def _write_latent(*args: Any, **kwargs: Any):
    from hwrun_tpu.kv_write import write_latent

    return write_latent(*args, **kwargs)


def _write_index_keys(*args: Any, **kwargs: Any):
    from hwrun_tpu.kv_write import write_index_keys

    return write_index_keys(*args, **kwargs)


def _logits_limits(spec: OpSpec) -> list[str]:
    reasons = format_reasons(spec, INDEX_KEY_FORMATS, "index-key")
    reasons += dtype_reasons(spec, QUERY_DTYPES, "query")
    if spec.head_dim not in (None, 128):
        reasons.append(f"head_dim must be 128 (one lane-width row per key), got {spec.head_dim}")
    return reasons


def _topk_limits(spec: OpSpec) -> list[str]:
    return dtype_reasons(spec, ("float32",), "logits")


def _attention_limits(spec: OpSpec) -> list[str]:
    reasons = dtype_reasons(spec, INPUT_DTYPES, "query")
    if spec.head_dim not in (None, 576):
        reasons.append(f"head_dim must be 576 (absorbed MLA), got {spec.head_dim}")
    return reasons


def _attention_vmem(spec: OpSpec, chip: Any, row_bytes: int) -> list[str]:
    """One grid step of the attention kernel in VMEM: its blocks, double-buffered by the
    pipeline (q bf16, the gathered rows, the mask, out fp32 and lse), and its temporaries (the
    decoded rows and the scores in fp32). Unknown sizes are the models' (128 heads, k 2048)."""
    heads, k = spec.num_heads or 128, spec.topk or 2048
    blocks = heads * 576 * 2 + k * row_bytes + k * 4 + heads * 512 * 4 + heads * 8
    temporaries = k * 576 * 4 + 2 * heads * k * 4
    need = 2 * blocks + temporaries
    if need > chip.vmem_capacity_bytes:
        return [
            f"{heads} heads x top-{k} needs {need / 2**20:.1f} MiB of VMEM per step, more than "
            f"the {chip.vmem_capacity_bytes >> 20} MiB of a TPU {chip.chip_version} core"
        ]
    return []


def _decode_chip_limits(spec: OpSpec, chip: Any) -> list[str]:
    fmt = spec.formats[0] if spec.formats else "bf16"
    return _attention_vmem(spec, chip, get_latent_format(fmt).row_bytes)


def _prefill_chip_limits(spec: OpSpec, chip: Any) -> list[str]:
    return _attention_vmem(spec, chip, 4 * 576)  # an fp32 workspace's rows, the wider kind


def _decode_limits(spec: OpSpec) -> list[str]:
    return format_reasons(spec, LATENT_FORMATS, "latent") + _attention_limits(spec)


def _lse_combine_limits(spec: OpSpec) -> list[str]:
    return dtype_reasons(spec, INPUT_DTYPES, "outs")


def _latent_write_limits(spec: OpSpec) -> list[str]:
    return format_reasons(spec, LATENT_FORMATS, "latent") + dtype_reasons(
        spec, INPUT_DTYPES, "input"
    )


def _index_key_write_limits(spec: OpSpec) -> list[str]:
    return format_reasons(spec, INDEX_KEY_FORMATS, "index-key") + dtype_reasons(
        spec, INPUT_DTYPES, "input"
    )


KERNELS: tuple[PallasKernel, ...] = (
    PallasKernel(
        "kv.write_latent",
        _write_latent,
        _latent_write_limits,
        "quantize one token per step in VMEM, DMA it to its slot (slots by scalar prefetch)",
        LATENT_FORMATS,
    ),
    PallasKernel(
        "kv.write_index_keys",
        _write_index_keys,
        _index_key_write_limits,
        "quantize one key per step, DMA its element and scale bytes into the block-major page",
        INDEX_KEY_FORMATS,
    ),
    PallasKernel(
        "indexer.logits_paged",
        _logits_paged,
        _logits_limits,
        "one page per step from the scalar-prefetched block table, keys decoded in VMEM",
        INDEX_KEY_FORMATS,
    ),
    PallasKernel(
        "indexer.logits_ragged",
        _logits_ragged,
        _logits_limits,
        "one query row against 128 keys per step",
        INDEX_KEY_FORMATS,
    ),
    PallasKernel(
        "indexer.topk",
        _topk,
        _topk_limits,
        "radix select per row, smallest index wins ties (SparseCore work on a TPU)",
    ),
    PallasKernel(
        "sparse_mla.decode",
        _decode,
        _decode_limits,
        "gather kernel (SparseCore step) into a dense buffer, dense attention over it",
        LATENT_FORMATS,
        chip_limits=_decode_chip_limits,
    ),
    PallasKernel(
        "sparse_mla.prefill",
        _prefill,
        _attention_limits,
        "the decode's gather and attention over the bf16 / fp32 workspace",
        chip_limits=_prefill_chip_limits,
    ),
    PallasKernel(
        "attn.lse_combine",
        _lse_combine,
        _lse_combine_limits,
        "parts folded in index order, 128 rows per step",
    ),
)
