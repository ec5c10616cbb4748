"""The storage formats' element rules as JAX code inside the kernels.

Each function is the in-kernel twin of a rule in ``hwrun.formats`` (docs/formats.md), written
so its bytes equal the reference's: e4m3 rounds to nearest even and saturates to +/-448 with
NaN as 0x7F; bf16 rounds to nearest even; NaNs stored as bytes are the canonical quiet NaN;
little-endian bytes (the CPU's and the TPU's order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from hwrun.formats.fp8 import E4M3_MAX, E4M3_NAN
from hwrun_tpu.bridge import true_divide

CANONICAL_NAN_F32 = 0x7FC00000
CANONICAL_NAN_BF16 = 0x7FC0


def e4m3_codes(x: jax.Array) -> jax.Array:  # [...] float32 -> [...] uint8
    """E4M3 codes: round to nearest even, saturate to +/-448, NaN -> 0x7F."""
    codes = lax.bitcast_convert_type(
        jnp.clip(x, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn), jnp.uint8
    )
    return jnp.where(jnp.isnan(x), jnp.uint8(E4M3_NAN), codes)


def e4m3_values(codes: jax.Array) -> jax.Array:  # [...] uint8 -> [...] float32
    return lax.bitcast_convert_type(codes, jnp.float8_e4m3fn).astype(jnp.float32)


def f32_bytes(x: jax.Array) -> jax.Array:  # [..., n] float32 -> [..., 4n] uint8
    """Little-endian bytes, NaN canonical."""
    bits = jnp.where(
        jnp.isnan(x), jnp.uint32(CANONICAL_NAN_F32), lax.bitcast_convert_type(x, jnp.uint32)
    )
    raw = lax.bitcast_convert_type(bits, jnp.uint8)  # [..., n, 4]
    return raw.reshape(*x.shape[:-1], x.shape[-1] * 4)


def f32_from_bytes(raw: jax.Array) -> jax.Array:  # [..., 4n] uint8 -> [..., n] float32
    return lax.bitcast_convert_type(raw.reshape(*raw.shape[:-1], -1, 4), jnp.float32)


def bf16_bytes(x: jax.Array) -> jax.Array:  # [..., n] float32 -> [..., 2n] uint8
    """bf16 (round to nearest even), NaN canonical, as little-endian bytes."""
    bits = lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    bits = jnp.where(jnp.isnan(x), jnp.uint16(CANONICAL_NAN_BF16), bits)
    raw = lax.bitcast_convert_type(bits, jnp.uint8)  # [..., n, 2]
    return raw.reshape(*x.shape[:-1], x.shape[-1] * 2)


def bf16_from_bytes(raw: jax.Array) -> jax.Array:  # [..., 2n] uint8 -> [..., n] float32
    pairs = raw.reshape(*raw.shape[:-1], -1, 2)
    return lax.bitcast_convert_type(pairs, jnp.bfloat16).astype(jnp.float32)


def ceil_pow2(s: jax.Array) -> jax.Array:  # [...] positive float32 -> [...] float32
    """The smallest power of two >= s, exactly, from the bits (``hwrun.formats.fp8.ceil_pow2``)."""
    bits = lax.bitcast_convert_type(s, jnp.int32)
    exponent = (bits >> 23) & 0xFF
    rounded_up = exponent + ((bits & 0x7FFFFF) != 0).astype(jnp.int32)
    return jnp.where(jnp.isnan(s), s, lax.bitcast_convert_type(rounded_up << 23, jnp.float32))


def fp8_scale(amax: jax.Array, floor: float, ue8m0: bool) -> jax.Array:
    """``max(amax, floor) / 448`` (correctly rounded), as a power of two when ``ue8m0``."""
    scale = true_divide(jnp.maximum(amax, floor), E4M3_MAX)
    scale = jnp.where(jnp.isnan(amax), amax, scale)  # a NaN group keeps a NaN scale
    return ceil_pow2(scale) if ue8m0 else scale
