"""Cache writes on NVIDIA: the Triton quantize-and-scatter kernels."""

from __future__ import annotations

import torch

from hwrun.registry import OpImpl, OpRegistry, OpSpec
from hwrun_nvidia.device_checks import dtype_reasons, format_reasons, triton_reasons

INPUT_DTYPES = ("bfloat16", "float16", "float32")


def _validate_latent(spec: OpSpec) -> list[str]:
    return (
        triton_reasons(spec)
        + format_reasons(spec, ("fp8_ds_mla", "bf16"), "latent")
        + dtype_reasons(spec, INPUT_DTYPES, "input")
    )


def _validate_index_keys(spec: OpSpec) -> list[str]:
    return (
        triton_reasons(spec)
        + format_reasons(spec, ("fp8", "mxfp4"), "index-key")
        + dtype_reasons(spec, INPUT_DTYPES, "input")
    )


def _triton_write_latent(
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8
    nope: torch.Tensor,  # [T, 512]
    rope: torch.Tensor,  # [T, 64]
    slots: torch.Tensor,  # [T] int32
    fmt: str,
    scale: float | None = None,
) -> None:
    from hwrun.kernels.triton.kv_write import write_latent

    write_latent(cache, nope, rope, slots, fmt, scale)


def _triton_write_index_keys(
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8
    keys: torch.Tensor,  # [T, 128]
    slots: torch.Tensor,  # [T] int32
    fmt: str,
) -> None:
    from hwrun.kernels.triton.kv_write import write_index_keys

    write_index_keys(cache, keys, slots, fmt)


def register(registry: OpRegistry) -> None:
    for op, fn, validate, what in (
        ("kv.write_latent", _triton_write_latent, _validate_latent, "fp8_ds_mla / bf16 rows"),
        ("kv.write_index_keys", _triton_write_index_keys, _validate_index_keys, "fp8 / mxfp4"),
    ):
        registry.register(
            OpImpl(
                op=op,
                name="triton",
                platform=registry.platform,
                fn=fn,
                validate=validate,
                priority=10,
                description=f"Triton: quantize and scatter in one pass, {what}",
            )
        )
