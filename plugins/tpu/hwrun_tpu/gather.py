"""The gather of the selected latent rows into a dense ``[rows, k, row_bytes]`` buffer, as its
own Pallas kernel: on a TPU this is the SparseCore's half of DSA (a row-granular gather from
HBM), so a SparseCore kernel can replace this one without touching the attention.

One grid step per query row: the row's k slots arrive through scalar prefetch, and each valid
slot's bytes are DMA'd from the paged cache (left in HBM) into the row's output block; an
invalid entry (-1) becomes a zero row, which every latent format decodes to zeros, and the
attention masks it. The rows stay in their stored format: the attention decodes them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from hwrun_tpu.bridge import interpret, interpret_mode


@functools.lru_cache(maxsize=64)
def _gather_call(rows: int, k: int, capacity: int, row_bytes: int, mode: str | None):
    def kernel(slots_ref, cache_ref, out_ref, sem):
        r = pl.program_id(0)

        def fetch(e, carry):
            slot = slots_ref[r * k + e]

            @pl.when(slot >= 0)
            def _():
                copy = pltpu.make_async_copy(
                    cache_ref.at[pl.ds(slot, 1)], out_ref.at[0, pl.ds(e, 1)], sem
                )
                copy.start()
                copy.wait()

            @pl.when(slot < 0)
            def _():
                out_ref[0, pl.ds(e, 1), :] = jnp.zeros((1, row_bytes), jnp.uint8)

            return carry

        lax.fori_loop(0, k, fetch, 0)

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(rows,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM)],
            out_specs=pl.BlockSpec((1, k, row_bytes), lambda r, slots: (r, 0, 0)),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        ),
        out_shape=jax.ShapeDtypeStruct((rows, k, row_bytes), jnp.uint8),
        interpret=interpret(mode),
    )
    return jax.jit(call)


def gather_rows(
    cache: jax.Array,  # [capacity, row_bytes] uint8, one stored row per slot
    slots: jax.Array,  # [R * k] int32, -1 = no entry
    rows: int,
    k: int,
) -> jax.Array:  # [R, k, row_bytes] uint8, zeros where the slot is -1
    capacity, row_bytes = cache.shape
    return _gather_call(rows, k, capacity, row_bytes, interpret_mode())(slots, cache)
