"""torch <-> JAX for the Pallas kernels: DLPack both ways, and how a kernel is run here.

Tensors cross through DLPack, so where both frameworks hold the same device no host copy is
made (on the CPU the JAX array and the torch tensor share memory). DLPack has no fp8 type that
both sides agree on, so fp8 codes cross as their uint8 bytes and the kernels bitcast them;
int64 indices are narrowed to int32 (JAX runs without x64, and every index here fits).

:func:`interpret` is the one place the kernels learn whether they run compiled (a TPU) or on
the CPU in one of Pallas's interpreters: ``HWRUN_PALLAS_INTERPRET=1`` its interpret mode (the
kernel body as JAX operations, grid steps in a loop, DMAs as copies), ``=tpu`` its TPU
interpret mode, which also emulates the TPU's memories, DMA semaphores and scalar prefetch and
raises on out-of-bounds reads (about three times slower here).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax.experimental.pallas import tpu as pltpu

from hwrun import knobs


def to_jax(t: torch.Tensor) -> jax.Array:
    """``t`` as a JAX array (zero-copy where DLPack allows)."""
    if t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    elif t.dtype == torch.int64:
        t = t.to(torch.int32)
    elif t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return jax.dlpack.from_dlpack(t.contiguous())


def to_torch(a: jax.Array) -> torch.Tensor:
    """``a`` as a torch tensor sharing its buffer."""
    return torch.from_dlpack(a)


def interpret_mode() -> str | None:
    """How the kernels run here: None (compiled for a TPU), "generic" or "tpu" (the knob's
    interpreters). Part of every compiled call's cache key."""
    return knobs.pallas_interpret()


def interpret(mode: str | None) -> Any:
    """``interpret=`` of a ``pallas_call`` for :func:`interpret_mode`'s ``mode``: False, True
    (Pallas's interpret mode) or its TPU interpret mode's parameters."""
    if mode == "tpu":
        return pltpu.InterpretParams()
    return mode == "generic"


def true_divide(x: jax.Array, denominator: jax.Array | float) -> jax.Array:
    """``x / denominator`` correctly rounded, ``denominator`` a constant or an array that
    broadcasts to ``x``: XLA turns a division by a constant or a broadcast value into a
    multiplication by its rounded reciprocal (1/448 is inexact), which moves fp8 codes by one
    step against the formats' rule (``hwrun.formats.arith.divide``); a full-shape divisor
    behind an optimization barrier stays a division."""
    full = jnp.broadcast_to(jnp.asarray(denominator, x.dtype), x.shape)
    return x / jax.lax.optimization_barrier(full)
