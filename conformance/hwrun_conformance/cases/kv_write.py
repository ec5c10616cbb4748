"""Cases of the cache writes `kv.write_latent` and `kv.write_index_keys`: bit-exact bytes.

Each case hands the op a cache that is a strided view (every block padded by extra bytes, as in
the packed hybrid cache), filled with random bytes: the whole view must equal the reference's
byte for byte (rows not named by a slot stay untouched), and the guard bytes around and between
the blocks must not change. Slots hold -1 padding; the tokens behind it may hold anything.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("kv.write_latent", "kv.write_index_keys")

LATENT_ROW_BYTES = {"bf16": 1152, "fp8_e4m3": 576, "fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
INDEX_KEY_BYTES = {"bf16": 256, "fp8": 132, "mxfp4": 68}
BLOCK_PAD_BYTES = 48  # extra bytes after every block: the view is strided


def _strided_cache(g: torch.Generator, num_blocks: int, block_bytes: int) -> torch.Tensor:
    packed = torch.randint(0, 256, (num_blocks, block_bytes + BLOCK_PAD_BYTES), generator=g)
    return packed.to(torch.uint8)[:, :block_bytes]


def _slots(g: torch.Generator, tokens: int, capacity: int) -> torch.Tensor:
    slots = torch.randperm(capacity, generator=g)[:tokens]
    if tokens > 1:
        slots[torch.rand(tokens, generator=g) < 0.25] = -1  # vLLM's padding tokens
    return slots.to(torch.int32)


def _values(g: torch.Generator, tokens: int, width: int, extreme: bool) -> torch.Tensor:
    x = torch.randn(tokens, width, generator=g)
    if extreme:
        x[0] *= 1e4  # saturates fp8 / fp4 unless the row scale follows
        x[1] *= 1e-30  # subnormal territory: scales must not divide by zero
        x[2] = 0.0  # an all-zero row
        x[3, ::3] = -x[3, ::3].abs() * 600  # one sign, far past e4m3's 448
    return x.to(torch.bfloat16)


def _perturb_skipped_tokens(names: tuple[str, ...]):
    def perturb(kwargs: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
        skipped = kwargs["slots"] < 0
        for name in names:
            noise = (torch.randn(kwargs[name].shape, generator=g) * 50).to(kwargs[name].dtype)
            kwargs[name] = torch.where(skipped[:, None], noise, kwargs[name])
        return kwargs

    return perturb


def _latent_sample(g, fmt: str, tokens: int, num_blocks: int, block_size: int, extreme: bool):
    row_bytes = LATENT_ROW_BYTES[fmt]
    cache = _strided_cache(g, num_blocks, block_size * row_bytes)
    cache = cache.view(num_blocks, block_size, row_bytes)
    kwargs = {
        "cache": cache,
        "nope": _values(g, tokens, 512, extreme),
        "rope": _values(g, tokens, 64, extreme),
        "slots": _slots(g, tokens, num_blocks * block_size),
        "fmt": fmt,
        "scale": 0.05 if fmt == "fp8_e4m3" else None,
    }
    return Sample(
        kwargs=kwargs,
        outputs=("cache",),
        inplace=("cache",),
        perturb_padding=_perturb_skipped_tokens(("nope", "rope")),
    )


def _index_sample(g, fmt: str, tokens: int, num_blocks: int, block_size: int, extreme: bool):
    cache = _strided_cache(g, num_blocks, block_size * INDEX_KEY_BYTES[fmt])
    kwargs = {
        "cache": cache,
        "keys": _values(g, tokens, 128, extreme),
        "slots": _slots(g, tokens, num_blocks * block_size),
        "fmt": fmt,
    }
    return Sample(
        kwargs=kwargs,
        outputs=("cache",),
        inplace=("cache",),
        perturb_padding=_perturb_skipped_tokens(("keys",)),
    )


def _case(
    op: str,
    fmt: str,
    name: str,
    seed: int,
    tokens: int,
    num_blocks: int,
    block_size: int,
    extreme: bool = False,
    quick: bool = True,
    about: str = "",
) -> list[Case]:
    build = _latent_sample if op == "kv.write_latent" else _index_sample
    case = Case(
        op=op,
        name=f"{fmt}_{name}",
        spec=OpSpec(op=op, dtype="bfloat16", formats=(fmt,), block_size=block_size),
        build=lambda g: build(g, fmt, tokens, num_blocks, block_size, extreme),
        checks={"cache": Check("exact")},
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(case, padding=True, quick_siblings=name == "small")


def cases(op: str) -> list[Case]:
    formats = LATENT_ROW_BYTES if op == "kv.write_latent" else INDEX_KEY_BYTES
    base = 600 if op == "kv.write_latent" else 700
    out: list[Case] = []
    for i, fmt in enumerate(formats):
        seed = base + 10 * i
        out += _case(op, fmt, "small", seed, 12, 4, 8, about="strided cache, -1 padding")
        out += _case(
            op,
            fmt,
            "extreme",
            seed + 1,
            9,
            3,
            4,
            extreme=True,
            about="saturating, subnormal and all-zero rows",
        )
        out += _case(
            op, fmt, "block64", seed + 2, 150, 5, 64, quick=False, about="the models' block size"
        )
        out += _case(op, fmt, "batch1", seed + 3, 1, 2, 16, about="one token")
        out += _case(
            op,
            fmt,
            "tokens_1000",
            seed + 4,
            1000,
            80,
            16,
            quick=False,
            about="a long prefill: 1000 tokens over 80 blocks",
        )
    return out


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random cache write: any format, token count, block count and size, -1 padding,
    saturating and subnormal rows."""
    formats = LATENT_ROW_BYTES if op == "kv.write_latent" else INDEX_KEY_BYTES
    fmt = rng.choice(sorted(formats))
    tokens = rng.choice((1, 4, 9, 64, 333, 1000))
    block_size = rng.choice((1, 16, 64))
    params = {
        "tokens": tokens,
        "num_blocks": -(-tokens // block_size) + rng.randint(0, 4),
        "block_size": block_size,
        "extreme": tokens >= 4 and rng.random() < 0.4,
    }
    about = replayable("*_case", op, fmt, name, seed, **params)
    return _case(op, fmt, name, seed, about=about, **params)[0]
