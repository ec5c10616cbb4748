"""kv.write_index_keys and kv.write_latent: quantize and scatter in one pass, byte-exact.

Each program encodes BLOCK_T tokens and stores their bytes at their slots (slot < 0 skipped).
The encodings follow hwrun.formats bit for bit: divisions are round-to-nearest
(``div_rn``), powers of two are built from exponent bits, e4m3 conversion rounds to nearest
even after clamping to +/-448, e2m1 uses the formats' tie-to-even buckets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.kernels.triton.indexer_logits import KEY_FORMATS
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.pdl import pdl_options, wait_for_previous_kernel

LATENT_FMTS = {"bf16": (0, 1152), "fp8_ds_mla": (1, 656)}


@triton.jit
def pow2_bits(biased_exponent):
    # 2^(biased_exponent - 127) as fp32 (biased_exponent in [1, 254]).
    return (biased_exponent.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_bits(x):
    # E4M3 by bit arithmetic rather than a hardware conversion: round-to-nearest-even after
    # clamping to +/-448, NaN -> 0x7F, on every backend (and in the interpreter) alike.
    a = tl.minimum(tl.abs(x), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    # Subnormals (below 2^-6) count in units of 2^-9; adding 2^23 rounds to nearest even.
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    keep = (bits >> 20) & 7
    rest = bits & 0xFFFFF
    up = (rest > 0x80000) | ((rest == 0x80000) & ((keep & 1) == 1))
    normal = ((((bits >> 23) & 0xFF) - 120) << 3) + keep + up.to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal)
    sign = (x.to(tl.int32, bitcast=True) >> 31) & 1
    code = code | (sign << 7)
    return tl.where(x != x, 0x7F, code).to(tl.uint8)


@triton.jit
def _e2m1_code(x):
    v = tl.abs(x)
    mag = (
        (v > 0.25).to(tl.int32)
        + (v >= 0.75).to(tl.int32)
        + (v > 1.25).to(tl.int32)
        + (v >= 1.75).to(tl.int32)
        + (v > 2.5).to(tl.int32)
        + (v >= 3.5).to(tl.int32)
        + (v > 5.0).to(tl.int32)
    )
    sign = ((x.to(tl.int32, bitcast=True) >> 31) & 1) << 3
    return tl.where(x != x, 0, mag | sign)


@triton.jit
def _write_index_keys_kernel(
    keys_ptr,  # [T, 128]
    slots_ptr,  # [T] int
    cache_ptr,  # [num_blocks, block_size * bpt] uint8
    T,
    block_size,
    block_stride,
    key_stride,
    FMT: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slots_ptr + t, mask=t < T, other=-1).to(tl.int64)
    ok = slot >= 0
    page = cache_ptr + (slot // block_size) * block_stride
    row = slot % block_size
    d = tl.arange(0, 128)
    x = tl.load(
        keys_ptr + t.to(tl.int64)[:, None] * key_stride + d[None, :], mask=ok[:, None], other=0.0
    )
    x = x.to(tl.float32)
    if FMT == 0:
        amax = tl.maximum(tl.max(tl.abs(x), 1), 1e-4)
        s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
        bits = s.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # ceil to a power of 2
        scale = pow2_bits(e)
        codes = e4m3_bits(x * pow2_bits(254 - e)[:, None])
        tl.store(page[:, None] + row[:, None] * 128 + d[None, :], codes, mask=ok[:, None])
        scale_ptrs = (page + block_size * 128 + row * 4).to(tl.pointer_type(tl.float32))
        tl.store(scale_ptrs, scale, mask=ok)
    else:
        groups = tl.reshape(x, (BLOCK_T, 4, 32))
        amax = tl.maximum(tl.max(tl.abs(groups), 2), 1e-4)  # [BLOCK_T, 4]
        q = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32))
        bits = q.to(tl.int32, bitcast=True)
        code = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # e + 127
        code = tl.minimum(code, 254)
        scaled = groups * pow2_bits(254 - code)[:, :, None]
        e2m1 = tl.reshape(_e2m1_code(scaled), (BLOCK_T, 64, 2))
        lo, hi = tl.split(e2m1)
        packed = (lo | (hi << 4)).to(tl.uint8)
        b = tl.arange(0, 64)
        tl.store(page[:, None] + row[:, None] * 64 + b[None, :], packed, mask=ok[:, None])
        g = tl.arange(0, 4)
        scale_ptrs = page[:, None] + block_size * 64 + row[:, None] * 4 + g[None, :]
        tl.store(scale_ptrs, code.to(tl.uint8), mask=ok[:, None])


@triton.jit
def _write_latent_kernel(
    nope_ptr,  # [T, 512]
    rope_ptr,  # [T, 64]
    slots_ptr,  # [T] int
    cache_ptr,  # [num_blocks, block_size, row_bytes] uint8
    T,
    block_size,
    block_stride,
    row_stride,
    nope_stride,
    rope_stride,
    FP8: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot >= 0:
        row = cache_ptr + (slot // block_size) * block_stride + (slot % block_size) * row_stride
        g = tl.arange(0, 4)
        d = tl.arange(0, 128)
        x = tl.load(nope_ptr + t.to(tl.int64) * nope_stride + g[:, None] * 128 + d[None, :])
        x = x.to(tl.float32)
        r = tl.arange(0, 64)
        rope = tl.load(rope_ptr + t.to(tl.int64) * rope_stride + r).to(tl.bfloat16)
        if FP8:
            amax = tl.max(tl.abs(x), 1)
            s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
            s = tl.maximum(s, 1.1754943508222875e-38)  # FLT_MIN
            codes = e4m3_bits(tl.math.div_rn(x, tl.broadcast_to(s[:, None], x.shape)))
            tl.store(row + g[:, None] * 128 + d[None, :], codes)
            tl.store((row + 512 + 4 * g).to(tl.pointer_type(tl.float32)), s)
            tl.store((row + 528).to(tl.pointer_type(tl.bfloat16)) + r, rope)
        else:
            out = row.to(tl.pointer_type(tl.bfloat16))
            tl.store(out + g[:, None] * 128 + d[None, :], x.to(tl.bfloat16))
            tl.store(out + 512 + r, rope)


def write_index_keys(
    cache: torch.Tensor,  # [num_blocks, block_size * bytes_per_token] uint8 (strided ok)
    keys: torch.Tensor,  # [T, 128] bfloat16 / float
    slots: torch.Tensor,  # [T] int32, negative = skip
    fmt: str,  # "fp8" or "mxfp4"
    block_t: int = 16,
) -> None:
    if fmt not in KEY_FORMATS:
        raise ValueError(
            f"write_index_keys (triton): format {fmt!r}; use one of {list(KEY_FORMATS)}"
        )
    code, elem_bytes, scale_bytes = KEY_FORMATS[fmt]
    bpt = elem_bytes + scale_bytes
    if (
        cache.dtype != torch.uint8
        or cache.dim() != 2
        or cache.shape[1] % bpt
        or cache.stride(1) != 1
    ):
        raise ValueError(
            f"write_index_keys: cache must be uint8 [num_blocks, block_size * {bpt}] with "
            f"contiguous pages, got {cache.dtype} {tuple(cache.shape)}"
        )
    if keys.dim() != 2 or keys.shape[1] != 128 or slots.shape != (keys.shape[0],):
        raise ValueError(
            f"write_index_keys: keys must be [T, 128] and slots [T], got {tuple(keys.shape)} "
            f"and {tuple(slots.shape)}"
        )
    T = keys.shape[0]
    if T == 0:
        return
    keys = keys if keys.stride(1) == 1 else keys.contiguous()
    prepare_launch()
    _write_index_keys_kernel[(triton.cdiv(T, block_t),)](
        keys,
        slots.contiguous(),
        cache,
        T,
        cache.shape[1] // bpt,
        cache.stride(0),
        keys.stride(0),
        FMT=code,
        ELEM_BYTES=elem_bytes,
        BLOCK_T=block_t,
        num_warps=4,
        **pdl_options(cache.device),
    )


def write_latent(
    cache: torch.Tensor,  # [num_blocks, block_size, row_bytes] uint8 (strided ok)
    nope: torch.Tensor,  # [T, 512]
    rope: torch.Tensor,  # [T, 64]
    slots: torch.Tensor,  # [T] int32, negative = skip
    fmt: str,  # "bf16" or "fp8_ds_mla"
    scale: float | None = None,
) -> None:
    if fmt not in LATENT_FMTS:
        raise ValueError(f"write_latent (triton): format {fmt!r}; use one of {list(LATENT_FMTS)}")
    if scale is not None:
        raise ValueError("write_latent (triton): a per-tensor scale applies to fp8_e4m3 only")
    code, row_bytes = LATENT_FMTS[fmt]
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != row_bytes:
        raise ValueError(
            f"write_latent: cache must be uint8 [num_blocks, block_size, {row_bytes}], got "
            f"{cache.dtype} {tuple(cache.shape)}"
        )
    if cache.stride(2) != 1 or cache.stride(1) % 16 or cache.stride(0) % 16:
        raise ValueError("write_latent: cache rows must be contiguous and 16-byte aligned")
    T = nope.shape[0]
    if nope.shape != (T, 512) or rope.shape != (T, 64) or slots.shape != (T,):
        raise ValueError(
            f"write_latent: nope [T, 512], rope [T, 64], slots [T] expected, got "
            f"{tuple(nope.shape)}, {tuple(rope.shape)}, {tuple(slots.shape)}"
        )
    if T == 0:
        return
    nope = nope if nope.stride(1) == 1 else nope.contiguous()
    rope = rope if rope.stride(1) == 1 else rope.contiguous()
    prepare_launch()
    _write_latent_kernel[(T,)](
        nope,
        rope,
        slots.contiguous(),
        cache,
        T,
        cache.shape[1],
        cache.stride(0),
        cache.stride(1),
        nope.stride(0),
        rope.stride(0),
        FP8=code == 1,
        num_warps=4,
        **pdl_options(cache.device),
    )
