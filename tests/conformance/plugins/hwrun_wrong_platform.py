"""A deliberately wrong platform for the conformance suite's negative controls.

Each op is broken in one known way (or not at all), so the suite must report exactly those
cases as FAIL, CRASH or TIMEOUT (KNOWN_FAILURE where the test's entry file names them) and the
rest as PASS. Loaded through HWRUN_PLUGINS with this
directory on PYTHONPATH.
"""

from __future__ import annotations

import math
import os
import signal
import time

import torch

from hwrun import API_VERSION
from hwrun.hookspecs import hookimpl
from hwrun.ops import attn, indexer, kda, kv_write, moe, topk
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpImpl, OpRegistry

NAME = "wrong"


def topk_off_by_one(logits, starts, ends, k):
    out = topk.topk(logits, starts, ends, k)
    return torch.where(out >= 0, out + 1, out)


def to_slots_raises(indices, block_table, block_size, request_of_row=None):
    raise RuntimeError("kernel launch failed: invalid configuration argument")


def lse_combine_log2(outs, lses):
    out, lse = attn.lse_combine(outs, lses)
    return out, lse / math.log(2.0)  # base-2 LSE where the contract says natural log


def kda_step_hangs_on_decode(q, k, v, g, beta, state, scale=None):
    if q.shape[0] == 3 and q.shape[1] == 1:
        marker = os.environ.get("HWRUN_TEST_HANG_MARKER")  # tells a test the hang has begun
        if marker:
            open(marker, "w").close()
        while True:
            time.sleep(1.0)
    return kda.step(q, k, v, g, beta, state, scale)


def route_dies_on_empty_batch_varies(router_logits, top_k, **options):
    if router_logits.shape[0] == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    weights, ids = moe.route(router_logits, top_k, **options)
    # Accurate to ~1e-6, but the rounding depends on the batch size: not batch-invariant.
    return weights * (1.0 + 1e-7 * router_logits.shape[0]), ids


def write_index_keys_swapped_nibbles(cache, keys, slots, fmt):
    """Right for bf16 and fp8; for mxfp4 puts element 2i in the high nibble instead of the low."""
    from hwrun.formats.index_keys import get_index_key_format

    kv_write.write_index_keys(cache, keys, slots, fmt)
    if fmt != "mxfp4":
        return
    key_format = get_index_key_format(fmt)
    block_size = cache.shape[1] // key_format.bytes_per_token
    elements, _ = key_format.split_pages(cache, block_size)
    kept = slots[slots >= 0].long()
    rows = elements[kept // block_size, kept % block_size]
    elements[kept // block_size, kept % block_size] = (rows << 4) | (rows >> 4)


def write_latent_one_byte_past(cache, nope, rope, slots, fmt, scale=None):
    """Right bytes, then one byte written just past the end of the cache view."""
    kv_write.write_latent(cache, nope, rope, slots, fmt, scale)
    last = cache.storage_offset() + sum(
        (n - 1) * s for n, s in zip(cache.shape, cache.stride(), strict=True)
    )
    past = torch.as_strided(cache, (1,), (1,), last + 1)
    past.add_(1)


def logits_ragged_doubled(q, weights, key_elements, key_scales, fmt, ks, ke):
    """Twice the right scores: the known failure the test's entry file names."""
    return indexer.logits_ragged(q, weights, key_elements, key_scales, fmt, ks, ke) * 2


IMPLS = {
    "indexer.logits_ragged": logits_ragged_doubled,
    "kv.write_index_keys": write_index_keys_swapped_nibbles,
    "kv.write_latent": write_latent_one_byte_past,
    "indexer.topk": topk_off_by_one,
    "indexer.to_slots": to_slots_raises,
    "attn.lse_combine": lse_combine_log2,
    "kda.step": kda_step_hangs_on_decode,
    "kda.chunk": kda.chunk,  # correct, and not claimed: the audit reports it
    "moe.route": route_dies_on_empty_batch_varies,
}


@hookimpl
def hwrun_api_version() -> str:
    return API_VERSION


@hookimpl
def hwrun_platform() -> PlatformInfo:
    return PlatformInfo(
        name=NAME, vendor="test", description="negative controls", device_source="none"
    )


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    for op, fn in IMPLS.items():
        registry.register(OpImpl(op=op, name="broken", platform=registry.platform, fn=fn))


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        ops=frozenset({"indexer.topk", "attn.lse_combine", "moe.route", "indexer.nonexistent"}),
        features=frozenset({"batch_invariant"}),
    )
