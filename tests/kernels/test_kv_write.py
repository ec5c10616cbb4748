"""kv.write_index_keys / kv.write_latent Triton kernels: byte-exact against the reference."""

from __future__ import annotations

import pytest
import torch

from hwrun.kernels.triton.kv_write import write_index_keys, write_latent
from hwrun.ops.kv_write import write_index_keys as reference_keys
from hwrun.ops.kv_write import write_latent as reference_latent


def _inputs(g, tokens, width):
    x = torch.randn(tokens, width, generator=g) * torch.logspace(-3, 3, tokens)[:, None]
    x[0] = 0.0  # an all-zero token: the scale floor
    x[1, ::7] = 1e-6  # tiny values next to zeros
    x[2, 5] = -0.0
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_write_index_keys_is_byte_exact(fmt):
    g = torch.Generator().manual_seed(1)
    tokens, block_size, num_blocks, bpt = 12, 8, 3, {"fp8": 132, "mxfp4": 68}[fmt]
    keys = _inputs(g, tokens, 128)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens].to(torch.int32)
    slots[3] = -1  # skipped
    base = torch.randint(0, 256, (num_blocks, block_size * bpt + 8), generator=g, dtype=torch.uint8)
    got, want = base.clone(), base.clone()
    write_index_keys(got[:, : block_size * bpt], keys, slots, fmt, block_t=4)
    reference_keys(want[:, : block_size * bpt], keys, slots, fmt)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
def test_write_latent_is_byte_exact(fmt):
    g = torch.Generator().manual_seed(2)
    tokens, block_size, num_blocks, row_bytes = 6, 4, 3, {"fp8_ds_mla": 656, "bf16": 1152}[fmt]
    nope, rope = _inputs(g, tokens, 512), _inputs(g, tokens, 64)
    slots = torch.tensor([5, -1, 0, 11, 7, 2], dtype=torch.int32)
    base = torch.randint(
        0, 256, (num_blocks, block_size * row_bytes + 32), generator=g, dtype=torch.uint8
    )
    view = lambda t: t[:, : block_size * row_bytes].unflatten(1, (block_size, row_bytes))  # noqa: E731
    got, want = base.clone(), base.clone()
    write_latent(view(got), nope, rope, slots, fmt)
    reference_latent(view(want), nope, rope, slots, fmt)
    assert torch.equal(got, want)
