"""Cases of `indexer.logits_ragged` and `indexer.logits_paged`.

Metric: the -inf positions (outside each row's keys) must match exactly, then DeepGEMM's
calc_diff over the rest. Keys are stored through the index-key formats (bf16, fp8, mxfp4), so
an impl must decode them exactly as docs/formats.md says. Edge cases: empty rows, few index
heads (ReLU ties), heads not a multiple of 16, fp8 query codes, next_n > 1, unallocated
block-table entries past a context (paged padding), contexts shorter than a block.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("indexer.logits_ragged", "indexer.logits_paged")
D = 128


def _query(g: torch.Generator, shape: tuple[int, ...], q_dtype: torch.dtype) -> torch.Tensor:
    q = torch.randn(*shape, generator=g)
    return q.to(q_dtype)  # float8_e4m3fn: the codes, with the scale folded into the weights


def _encode_keys(fmt: str, keys: torch.Tensor):
    from hwrun.formats.index_keys import get_index_key_format

    return get_index_key_format(fmt).encode(keys)


def _ragged_sample(g, fmt, rows, heads, keys, q_dtype) -> Sample:
    key_values = torch.randn(keys, D, generator=g).to(torch.bfloat16)
    elements, scales = _encode_keys(fmt, key_values)
    # Causal prefill: row i sees keys [ks, ke) of its sequence; row 0 sees none.
    ks = torch.randint(0, keys // 2, (rows,), generator=g)
    ke = torch.minimum(ks + torch.randint(0, keys, (rows,), generator=g), torch.tensor(keys))
    if rows > 1:
        ke[0] = ks[0]
    else:
        ks[0], ke[0] = 0, keys  # batch 1: the one row sees every key (every key tile)
    return Sample(
        kwargs={
            "q": _query(g, (rows, heads, D), q_dtype),
            "weights": torch.randn(rows, heads, generator=g) * heads**-0.5,
            "key_elements": elements,
            "key_scales": scales,
            "fmt": fmt,
            "ks": ks.to(torch.int32),
            "ke": ke.to(torch.int32),
        },
        outputs=("logits",),
        rows=RowSplit(args={"q": 0, "weights": 0, "ks": 0, "ke": 0}, outputs={"logits": 0}),
    )


def _paged_sample(
    g, fmt, batch, next_n, heads, block_size, max_blocks, q_dtype, partial=False
) -> Sample:
    from hwrun.formats.index_keys import get_index_key_format

    key_format = get_index_key_format(fmt)
    num_blocks = batch * max_blocks + 2
    lengths = torch.randint(next_n, max_blocks * block_size + 1, (batch,), generator=g)
    if partial:
        # Every context ends inside its last block, at least one block in.
        lengths = torch.randint(block_size, max_blocks * block_size, (batch,), generator=g)
        full = lengths % block_size == 0
        lengths[full] -= torch.randint(1, block_size, (int(full.sum()),), generator=g)
        lengths[-1] = max_blocks * block_size - 1  # every block, the last one partial
    elif batch > 1:
        lengths[0] = next_n  # a context shorter than a block
    table = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].reshape(batch, -1)
    for b in range(batch):
        table[b, -(-int(lengths[b]) // block_size) :] = -1  # unallocated past the context
    cache = torch.randint(
        0, 256, (num_blocks, block_size * key_format.bytes_per_token), generator=g
    )
    cache = cache.to(torch.uint8)
    elements, scales = key_format.split_pages(cache, block_size)
    keys = torch.randn(num_blocks * block_size, D, generator=g).to(torch.bfloat16)
    enc_elements, enc_scales = key_format.encode(keys)
    elements.copy_(enc_elements.view(num_blocks, block_size, -1))
    if key_format.scale_bytes:
        scales.copy_(enc_scales.view(num_blocks, block_size, -1))
    offsets = torch.arange(next_n) - (next_n - 1)
    context_lens = (lengths[:, None] + offsets).to(torch.int32)
    split = RowSplit(
        args={"q": 0, "weights": 0, "block_table": 0, "context_lens": 0},
        outputs={"logits": 0},
    )
    return Sample(
        kwargs={
            "q": _query(g, (batch, next_n, heads, D), q_dtype),
            "weights": torch.randn(batch * next_n, heads, generator=g) * heads**-0.5,
            "cache": cache,
            "fmt": fmt,
            "block_table": table.to(torch.int32),
            "context_lens": context_lens,
            "max_ctx": max_blocks * block_size,
        },
        outputs=("logits",),
        perturb_padding=_perturb_unused_pages,
        rows=split if next_n == 1 else None,  # weights rows are [B * n]: split by request only
    )


def _perturb_unused_pages(kwargs: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    """Blocks no request reads hold any bytes; table entries past a context name any block."""
    table = kwargs["block_table"].clone()
    cache = kwargs["cache"].clone()
    used = torch.zeros(cache.shape[0], dtype=torch.bool)
    used[table[table >= 0].long()] = True
    noise = torch.randint(0, 256, cache.shape, generator=g).to(torch.uint8)
    cache[~used] = noise[~used]
    unallocated = table < 0
    table[unallocated] = torch.randint(
        0, cache.shape[0], (int(unallocated.sum()),), generator=g
    ).to(table.dtype)
    kwargs["cache"], kwargs["block_table"] = cache, table
    return kwargs


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _ragged(
    fmt,
    name,
    seed,
    rows,
    heads,
    keys,
    q_dtype=torch.bfloat16,
    quick=True,
    about="",
    quick_siblings=None,
    invariances=True,
):
    op = "indexer.logits_ragged"
    case = Case(
        op=op,
        name=f"{fmt}_{name}",
        spec=OpSpec(op=op, dtype=_dtype_name(q_dtype), formats=(fmt,), num_heads=heads, head_dim=D),
        build=lambda g: _ragged_sample(g, fmt, rows, heads, keys, q_dtype),
        checks={"logits": Check("logits")},
        seed=seed,
        quick=quick,
        about=about,
    )
    siblings = fmt == "fp8" if quick_siblings is None else quick_siblings
    return variants(case, batch=invariances and rows > 1, quick_siblings=siblings)


def _paged(
    fmt,
    name,
    seed,
    batch,
    next_n,
    heads,
    block_size,
    max_blocks,
    q_dtype=torch.bfloat16,
    quick=True,
    about="",
    partial=False,
    quick_siblings=None,
    invariances=True,
):
    op = "indexer.logits_paged"
    case = Case(
        op=op,
        name=f"{fmt}_{name}",
        spec=OpSpec(
            op=op,
            dtype=_dtype_name(q_dtype),
            formats=(fmt,),
            num_heads=heads,
            head_dim=D,
            block_size=block_size,
        ),
        build=lambda g: _paged_sample(
            g, fmt, batch, next_n, heads, block_size, max_blocks, q_dtype, partial
        ),
        checks={"logits": Check("logits")},
        seed=seed,
        quick=quick,
        about=about,
    )
    siblings = fmt == "fp8" if quick_siblings is None else quick_siblings
    batch_sibling = invariances and next_n == 1 and batch > 1
    return variants(case, padding=invariances, batch=batch_sibling, quick_siblings=siblings)


def cases(op: str) -> list[Case]:
    out: list[Case] = []
    for i, fmt in enumerate(("bf16", "fp8", "mxfp4")):
        seed = 800 + 20 * i
        if op == "indexer.logits_ragged":
            out += _ragged(fmt, "h4_ties", seed, 6, 4, 40, about="4 index heads: many ReLU zeros")
            out += _ragged(
                fmt,
                "h20",
                seed + 1,
                5,
                20,
                33,
                quick=fmt != "bf16",
                about="heads not a multiple of 16",
            )
            out += _ragged(
                fmt,
                "fp8_q_h64",
                seed + 2,
                8,
                64,
                300,
                torch.float8_e4m3fn,
                quick=False,
                about="fp8 query codes, the models' 64 heads",
            )
            out += _ragged(
                fmt,
                "batch1",
                seed + 3,
                1,
                8,
                300,
                quick=fmt == "fp8",
                about="one query row over five 64-key tiles",
            )
            out += _ragged(
                fmt,
                "tiles",
                seed + 4,
                9,
                8,
                200,
                quick=fmt != "bf16",
                about="rows over three 4-row programs, keys over four 64-key tiles",
            )
            out += _ragged(
                fmt,
                "rows_1100",
                seed + 5,
                1100,
                4,
                150,
                quick=False,
                invariances=False,
                about="a large batch: rows past 1000, each against the reference",
            )
        else:
            out += _paged(
                fmt, "decode", seed + 10, 3, 1, 8, 16, 4, about="short contexts, -1 table"
            )
            out += _paged(
                fmt,
                "mtp3",
                seed + 11,
                2,
                3,
                12,
                16,
                3,
                quick=fmt == "fp8",
                about="next_n = 3 rows per request",
            )
            out += _paged(
                fmt,
                "block64_h64",
                seed + 12,
                2,
                1,
                64,
                64,
                5,
                torch.float8_e4m3fn,
                quick=False,
                about="the models' shape, fp8 query codes",
            )
            out += _paged(
                fmt,
                "batch1_blocks20",
                seed + 13,
                1,
                1,
                8,
                16,
                20,
                partial=True,
                quick=fmt == "fp8",
                about="one request over 20 blocks, the last one partial: several programs",
            )
            out += _paged(
                fmt,
                "partial_blocks",
                seed + 14,
                4,
                1,
                8,
                16,
                9,
                partial=True,
                quick=fmt != "bf16",
                quick_siblings=False,
                about="every context ends inside its last block",
            )
            out += _paged(
                fmt,
                "block64_long",
                seed + 15,
                4,
                1,
                32,
                64,
                48,
                partial=True,
                quick=False,
                about="contexts up to 3072 tokens over 48 blocks of 64, partial last blocks",
            )
            out += _paged(
                fmt,
                "requests_300",
                seed + 16,
                300,
                1,
                4,
                16,
                3,
                quick=False,
                invariances=False,
                about="a large batch of requests, each against the reference",
            )
    return out


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random indexer-logits case: any key format, head count, row and key count, query
    dtype; paged: any batch, next_n, block size, context (partial last blocks included)."""
    fmt = rng.choice(("bf16", "fp8", "mxfp4"))
    common = {
        "heads": rng.choice((1, 4, 8, 16, 20, 32, 64)),
        "q_dtype": rng.choice((torch.bfloat16, torch.float8_e4m3fn)),
    }
    if op == "indexer.logits_ragged":
        params = {"rows": rng.choice((1, 2, 5, 9, 40)), "keys": rng.randint(2, 600), **common}
        about = replayable("*_ragged", fmt, name, seed, **params)
        return _ragged(fmt, name, seed, about=about, **params)[0]
    params = {
        "batch": rng.choice((1, 2, 3, 8, 20)),
        "next_n": rng.choice((1, 1, 2, 3)),
        "block_size": rng.choice((16, 64)),
        "max_blocks": rng.randint(2, 40),
        "partial": rng.random() < 0.5,
        **common,
    }
    about = replayable("*_paged", fmt, name, seed, **params)
    return _paged(fmt, name, seed, about=about, **params)[0]
