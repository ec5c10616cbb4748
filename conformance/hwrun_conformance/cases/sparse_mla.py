"""Cases of `sparse_mla.decode` and `sparse_mla.prefill` (allclose on out and natural-log LSE).

Edge cases from the contract: -1 padding anywhere in a row, a row with no valid entry (out 0,
LSE -inf), ``topk_length`` cutting rows short, an attention sink, heads not a multiple of 16,
next_n > 1, every latent format. Padding invariance: cache rows no valid slot names and entries
past ``topk_length`` may hold anything.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("sparse_mla.decode", "sparse_mla.prefill")
QK, V = 576, 512
SCALE = QK**-0.5


def _indices(g: torch.Generator, rows: int, k: int, limit: int, with_length: bool):
    idx = torch.stack([torch.randperm(limit, generator=g)[:k] for _ in range(rows)])
    idx[torch.rand(rows, k, generator=g) < 0.3] = -1  # padding anywhere
    if rows > 1:
        idx[0] = -1  # an empty row
    length = torch.randint(1, k + 1, (rows,), generator=g) if with_length else None
    return idx.to(torch.int32), None if length is None else length.to(torch.int32)


def _sink(g: torch.Generator, heads: int, with_sink: bool) -> torch.Tensor | None:
    return torch.randn(heads, generator=g) if with_sink else None


def _decode_sample(
    g, fmt, batch, next_n, heads, k, block_size, with_length, with_sink, num_blocks
) -> Sample:
    from hwrun.formats.latent import get_latent_format

    latent = get_latent_format(fmt)
    tokens = num_blocks * block_size
    scale = 0.05 if fmt == "fp8_e4m3" else None
    rows = latent.encode(
        torch.randn(tokens, 512, generator=g).to(torch.bfloat16),
        torch.randn(tokens, 64, generator=g).to(torch.bfloat16),
        scale,
    )
    slots, length = _indices(g, batch * next_n, k, tokens, with_length)
    kwargs = {
        "q": (torch.randn(batch, next_n, heads, QK, generator=g) * 0.5).to(torch.bfloat16),
        "cache": rows.view(num_blocks, block_size, latent.row_bytes),
        "fmt": fmt,
        "slots": slots.view(batch, next_n, k),
        "softmax_scale": SCALE,
        "topk_length": None if length is None else length.view(batch, next_n),
        "attn_sink": _sink(g, heads, with_sink),
        "latent_scale": scale,
    }
    split = {"q": 0, "slots": 0} | ({"topk_length": 0} if with_length else {})
    return Sample(
        kwargs=kwargs,
        outputs=("out", "lse"),
        perturb_padding=_perturb_decode,
        rows=RowSplit(args=split, outputs={"out": 0, "lse": 0}),
    )


def _perturb_decode(kwargs: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    cache, slots = kwargs["cache"].clone(), kwargs["slots"].clone()
    block_size = cache.shape[1]
    flat = cache.view(-1, cache.shape[2])
    valid = _valid(slots.view(-1, slots.shape[-1]), kwargs["topk_length"])
    used = torch.zeros(flat.shape[0], dtype=torch.bool)
    used[slots.view(-1, slots.shape[-1])[valid].long()] = True
    noise = torch.randint(0, 256, flat.shape, generator=g).to(torch.uint8)
    flat[~used] = noise[~used]
    # Entries past topk_length are ignored whatever they hold.
    past = _past_length(valid.shape, kwargs["topk_length"])
    replacement = torch.randint(0, flat.shape[0], valid.shape, generator=g).to(slots.dtype)
    slots.view(valid.shape)[past] = replacement[past]
    kwargs["cache"], kwargs["slots"] = flat.view(-1, block_size, cache.shape[2]), slots
    return kwargs


def _valid(idx: torch.Tensor, length: torch.Tensor | None) -> torch.Tensor:
    valid = idx >= 0
    return valid & ~_past_length(idx.shape, length)


def _past_length(shape, length: torch.Tensor | None) -> torch.Tensor:
    if length is None:
        return torch.zeros(shape, dtype=torch.bool)
    return torch.arange(shape[1])[None, :] >= length.reshape(-1, 1).long()


def _prefill_sample(g, tokens, heads, k, workspace, with_length, with_sink) -> Sample:
    indices, length = _indices(g, tokens, k, workspace, with_length)
    kwargs = {
        "q": (torch.randn(tokens, heads, QK, generator=g) * 0.5).to(torch.bfloat16),
        "kv": torch.randn(workspace, QK, generator=g).to(torch.bfloat16),
        "indices": indices,
        "softmax_scale": SCALE,
        "topk_length": length,
        "attn_sink": _sink(g, heads, with_sink),
    }
    split = {"q": 0, "indices": 0} | ({"topk_length": 0} if with_length else {})
    return Sample(
        kwargs=kwargs,
        outputs=("out", "lse"),
        perturb_padding=_perturb_prefill,
        rows=RowSplit(args=split, outputs={"out": 0, "lse": 0}),
    )


def _perturb_prefill(kwargs: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    kv, indices = kwargs["kv"].clone(), kwargs["indices"].clone()
    valid = _valid(indices, kwargs["topk_length"])
    used = torch.zeros(kv.shape[0], dtype=torch.bool)
    used[indices[valid].long()] = True
    noise = torch.randn(kv.shape, generator=g).to(kv.dtype) * 30
    kv[~used] = noise[~used]
    past = _past_length(indices.shape, kwargs["topk_length"])
    replacement = torch.randint(0, kv.shape[0], indices.shape, generator=g).to(indices.dtype)
    indices[past] = replacement[past]
    kwargs["kv"], kwargs["indices"] = kv, indices
    return kwargs


_CHECKS = {"out": Check("allclose"), "lse": Check("allclose")}


def _decode(
    fmt,
    name,
    seed,
    batch,
    next_n,
    heads,
    k,
    block_size=16,
    with_length=False,
    with_sink=False,
    quick=True,
    about="",
    num_blocks=6,
) -> list[Case]:
    op = "sparse_mla.decode"
    case = Case(
        op=op,
        name=f"{fmt}_{name}",
        spec=OpSpec(
            op=op,
            dtype="bfloat16",
            formats=(fmt,),
            num_heads=heads,
            head_dim=QK,
            block_size=block_size,
            topk=k,
        ),
        build=lambda g: _decode_sample(
            g, fmt, batch, next_n, heads, k, block_size, with_length, with_sink, num_blocks
        ),
        checks=_CHECKS,
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(
        case, padding=True, batch=batch * next_n > 1, quick_siblings=fmt == "fp8_ds_mla"
    )


def _prefill(
    name,
    seed,
    tokens,
    heads,
    k,
    workspace,
    with_length=False,
    with_sink=False,
    quick=True,
    about="",
) -> list[Case]:
    op = "sparse_mla.prefill"
    case = Case(
        op=op,
        name=name,
        spec=OpSpec(op=op, dtype="bfloat16", num_heads=heads, head_dim=QK, topk=k),
        build=lambda g: _prefill_sample(g, tokens, heads, k, workspace, with_length, with_sink),
        checks=_CHECKS,
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(case, padding=True, batch=tokens > 1)


def cases(op: str) -> list[Case]:
    if op == "sparse_mla.prefill":
        return [
            *_prefill("h16", 951, 5, 16, 24, 64, about="-1 padding, an empty row"),
            *_prefill(
                "h10_length_sink",
                952,
                4,
                10,
                16,
                48,
                with_length=True,
                with_sink=True,
                about="heads not a multiple of 16, topk_length, attention sink",
            ),
            *_prefill("h128_k512", 953, 3, 128, 512, 1024, quick=False, about="128 heads, k 512"),
            *_prefill("batch1", 954, 1, 16, 64, 256, about="one token"),
            *_prefill(
                "tokens_64_k1024",
                955,
                64,
                16,
                1024,
                2048,
                with_length=True,
                quick=False,
                about="a prefill chunk of 64 tokens, k = 1024 over a 2048-row workspace",
            ),
        ]
    out: list[Case] = []
    for i, fmt in enumerate(("bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla")):
        seed = 900 + 10 * i
        out += _decode(fmt, "h16", seed, 3, 1, 16, 16, about="-1 padding, an empty row")
        out += _decode(
            fmt,
            "mtp2_h10_length_sink",
            seed + 1,
            2,
            2,
            10,
            12,
            with_length=True,
            with_sink=True,
            quick=fmt == "fp8_ds_mla",
            about="next_n 2, 10 heads, topk_length, attention sink",
        )
        out += _decode(
            fmt,
            "h128_k256",
            seed + 2,
            2,
            1,
            128,
            256,
            block_size=64,
            quick=False,
            about="the models' 128 heads, block 64",
        )
        out += _decode(
            fmt,
            "batch1_k512",
            seed + 3,
            1,
            1,
            16,
            512,
            block_size=64,
            num_blocks=12,
            quick=fmt == "fp8_ds_mla",
            about="batch 1, top-k over 12 blocks of 64: split over several programs",
        )
        out += _decode(
            fmt,
            "k2048_h64",
            seed + 4,
            2,
            1,
            64,
            2048,
            block_size=64,
            num_blocks=48,
            with_length=True,
            quick=False,
            about="k = 2048 spanning 48 blocks of 64, topk_length",
        )
        out += _decode(
            fmt,
            "batch64",
            seed + 5,
            64,
            1,
            16,
            32,
            num_blocks=16,
            quick=False,
            about="a large decode batch",
        )
    return out


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random sparse-MLA case: any latent format, batch, next_n, head count, top-k over
    any number of blocks, -1 padding, topk_length, attention sink."""
    heads = rng.choice((1, 8, 10, 16, 32, 64, 128))
    k = rng.choice((1, 7, 16, 64, 256, 512, 2048))
    flags = {"with_length": rng.random() < 0.5, "with_sink": rng.random() < 0.3}
    if op == "sparse_mla.prefill":
        params = {
            "tokens": rng.choice((1, 3, 17)),
            "heads": heads,
            "k": k,
            "workspace": k + rng.randint(0, 512),
            **flags,
        }
        about = replayable("*_prefill", name, seed, **params)
        return _prefill(name, seed, about=about, **params)[0]
    fmt = rng.choice(("bf16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"))
    block_size = rng.choice((16, 64))
    params = {
        "batch": rng.choice((1, 2, 5)),
        "next_n": rng.choice((1, 1, 2)),
        "heads": heads,
        "k": k,
        "block_size": block_size,
        "num_blocks": -(-k // block_size) + rng.randint(0, 8),
        **flags,
    }
    about = replayable("*_decode", fmt, name, seed, **params)
    return _decode(fmt, name, seed, about=about, **params)[0]
