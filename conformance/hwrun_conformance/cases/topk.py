"""Cases of `indexer.topk` and `indexer.to_slots`.

Top-k is compared as index sets with the tie rule (every returned index scores at least the
row's k-th best, no duplicates, short rows return all their columns then -1), so a kernel that
breaks ties differently from the reference still passes. Ties are the normal case: the logits
are ReLU sums, so many keys score exactly 0.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

from hwrun.registry import OpSpec
from hwrun_conformance.case import Case, Check, RowSplit, Sample, variants
from hwrun_conformance.cases import replayable

OPS = ("indexer.topk", "indexer.to_slots")

_TOPK_ROWS = RowSplit(args={"logits": 0, "starts": 0, "ends": 0}, outputs={"indices": 0})


def _scores(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    logits = kwargs["logits"]
    # The contract ranks NaN as -inf; the metric must see the same order.
    scores = torch.where(logits.isnan(), float("-inf"), logits)
    return {"scores": scores, "starts": kwargs["starts"], "ends": kwargs["ends"]}


def _sorted_rows(indices: torch.Tensor) -> torch.Tensor:
    """A row's indices as a set: the contract leaves their order free (a multi-program gather
    on a GPU writes them in whatever order its programs finish)."""
    return torch.sort(indices, dim=-1).values


_TOPK_CHECKS = {"indices": Check("index_set", context=_scores, canonical=_sorted_rows)}


def _topk_sample(
    g: torch.Generator,
    rows: int,
    length: int,
    k: int,
    *,
    zero_fraction: float = 0.0,
    short: bool = False,
    specials: bool = False,
    whole_last_row: bool = False,
) -> Sample:
    logits = torch.randn(rows, length, generator=g)
    if zero_fraction:
        # ReLU-style exact zeros, plus a few repeated positive values: ties at every rank.
        logits = torch.relu(logits - torch.quantile(logits, zero_fraction))
        logits = torch.round(logits * 4) / 4
    if specials:
        logits[0, 1::7] = float("-inf")
        logits[1, 2::5] = float("nan")
        logits[2, :] = float("-inf")
    if short:
        lengths = torch.randint(0, k, (rows,), generator=g)
        lengths[0] = 0  # an empty row: all -1
        lengths[-1] = k  # exactly k
    else:
        lengths = torch.randint(k, length + 1, (rows,), generator=g)
    if whole_last_row:
        lengths[-1] = length  # one window over every column: as many tiles as the row has
    starts = torch.randint(0, length + 1, (rows,), generator=g)
    starts = torch.minimum(starts, length - lengths)
    ends = starts + lengths
    return Sample(
        kwargs={
            "logits": logits.float(),
            "starts": starts.to(torch.int32),
            "ends": ends.to(torch.int32),
            "k": k,
        },
        outputs=("indices",),
        perturb_padding=_perturb_outside,
        rows=_TOPK_ROWS,
    )


def _perturb_outside(kwargs: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    """Columns outside a row's [start, end) are not part of it: any value there is ignored."""
    logits = kwargs["logits"]
    column = torch.arange(logits.shape[1])
    outside = (column < kwargs["starts"][:, None].long()) | (
        column >= kwargs["ends"][:, None].long()
    )
    noise = torch.randn(logits.shape, generator=g) * 100
    kwargs["logits"] = torch.where(outside, noise, logits)
    return kwargs


def _topk(
    name,
    seed,
    rows,
    length,
    k,
    quick=True,
    about="",
    invariances=True,
    **shape,
) -> list[Case]:
    """One top-k case; ``invariances=False`` leaves out the padding and batch siblings (the
    large-batch cases: each sibling reruns every row)."""
    case = Case(
        op="indexer.topk",
        name=name,
        spec=OpSpec(op="indexer.topk", dtype="float32", topk=k),
        build=lambda g: _topk_sample(g, rows, length, k, **shape),
        checks=_TOPK_CHECKS,
        seed=seed,
        quick=quick,
        about=about,
    )
    return variants(case, padding=invariances, batch=invariances and rows > 1)


def _slots_sample(
    g: torch.Generator,
    requests: int,
    n: int,
    k: int,
    block_size: int,
    explicit: bool,
    max_blocks: int = 6,
) -> Sample:
    num_blocks = requests * max_blocks + 3
    table = torch.randperm(num_blocks, generator=g)[: requests * max_blocks].reshape(
        requests, max_blocks
    )
    lengths = torch.randint(1, max_blocks * block_size + 1, (requests,), generator=g)
    rows = requests * n
    request_of_row = torch.arange(rows) // n
    if explicit:
        request_of_row = request_of_row[torch.randperm(rows, generator=g)]
    row_len = lengths[request_of_row]
    raw = torch.randint(0, 1 << 30, (rows, k), generator=g)
    indices = raw % row_len[:, None]
    indices[torch.rand(rows, k, generator=g) < 0.2] = -1  # padding anywhere in the row
    if rows > 1:
        indices[0, :] = -1  # an empty row
    # Unallocated table entries past each request's length must never be read.
    for req in range(requests):
        used = -(-int(lengths[req]) // block_size)
        table[req, used:] = -1
    kwargs = {
        "indices": indices.to(torch.int32),
        "block_table": table.to(torch.int32),
        "block_size": block_size,
        "request_of_row": request_of_row.to(torch.int32) if explicit else None,
    }
    return Sample(kwargs=kwargs, outputs=("slots",))


def _slots(
    name, seed, requests, n, k, block_size, explicit, quick=True, about="", max_blocks=6
) -> Case:
    return Case(
        op="indexer.to_slots",
        name=name,
        spec=OpSpec(op="indexer.to_slots", block_size=block_size, topk=k),
        build=lambda g: _slots_sample(g, requests, n, k, block_size, explicit, max_blocks),
        checks={"slots": Check("exact")},
        seed=seed,
        quick=quick,
        about=about,
    )


def cases(op: str) -> list[Case]:
    if op == "indexer.topk":
        return [
            *_topk("random", 101, 6, 96, 16, about="distinct scores, long rows"),
            *_topk("relu_ties", 102, 6, 96, 16, zero_fraction=0.7, about="most scores exactly 0"),
            *_topk("short_rows", 103, 6, 64, 24, short=True, about="rows shorter than k, empty"),
            *_topk("inf_nan", 104, 4, 64, 8, specials=True, about="-inf and NaN inside ranges"),
            *_topk("batch1", 107, 1, 5000, 32, whole_last_row=True, about="one row over two tiles"),
            *_topk(
                "long_rows",
                108,
                3,
                9000,
                64,
                zero_fraction=0.5,
                whole_last_row=True,
                about="windows over three 4096-column tiles, ties",
            ),
            *_topk("k2048", 105, 3, 4096, 2048, quick=False, about="the models' k over 4K columns"),
            *_topk(
                "k2048_ties",
                106,
                3,
                4096,
                2048,
                zero_fraction=0.6,
                quick=False,
                about="k = 2048 with mostly-zero scores",
            ),
            *_topk(
                "k2048_64k",
                109,
                2,
                65536,
                2048,
                whole_last_row=True,
                quick=False,
                about="k = 2048 over 64K columns: 16 tiles, several programs per row",
            ),
            *_topk(
                "k2048_64k_ties",
                110,
                2,
                65536,
                2048,
                zero_fraction=0.9,
                whole_last_row=True,
                quick=False,
                about="k = 2048 over 64K columns, 90% exact zeros",
            ),
            *_topk(
                "rows_4100",
                111,
                4100,
                160,
                16,
                zero_fraction=0.3,
                quick=False,
                invariances=False,
                about="a large batch: rows past the first thousands, each against the reference",
            ),
        ]
    return [
        _slots("decode", 201, 3, 1, 32, 16, False, about="one row per request, -1 padding"),
        _slots("mtp", 202, 2, 3, 24, 64, False, about="next_n = 3 rows per request"),
        _slots("explicit_rows", 203, 4, 2, 16, 16, True, about="request_of_row given, shuffled"),
        _slots("batch1", 205, 1, 1, 64, 16, False, max_blocks=12, about="one request, one row"),
        _slots("k2048", 204, 2, 2, 2048, 64, False, quick=False, about="the models' k"),
        _slots(
            "long_context",
            206,
            3,
            1,
            2048,
            64,
            False,
            max_blocks=64,
            quick=False,
            about="contexts up to 4096 tokens over 64 blocks of 64",
        ),
        _slots(
            "rows_1200",
            207,
            600,
            2,
            32,
            16,
            True,
            quick=False,
            about="a large batch of rows, request_of_row shuffled",
        ),
    ]


def fuzz(op: str, rng: random.Random, name: str, seed: int) -> Case:
    """One random top-k or to_slots case: any batch, row length and k of the contract, ties,
    rows shorter than k, -inf and NaN, -1 padding."""
    if op == "indexer.topk":
        rows = rng.choice((1, 2, 3, 5, 8, 33, 130))
        length = int(2 ** rng.uniform(0, 16.2))  # 1 .. ~75K columns, log-uniform
        k = min(rng.choice((1, 4, 16, 64, 256, 512, 2048)), length)
        shape = {"zero_fraction": rng.choice((0.0, 0.0, 0.5, 0.9))}
        if rng.random() < 0.2:
            shape["short"] = True
        if rows >= 3 and rng.random() < 0.2:
            shape["specials"] = True
        if rng.random() < 0.5:
            shape["whole_last_row"] = True
        about = replayable("*_topk", name, seed, rows=rows, length=length, k=k, **shape)
        return _topk(name, seed, rows, length, k, about=about, **shape)[0]
    params = {
        "requests": rng.choice((1, 2, 7, 40)),
        "n": rng.choice((1, 1, 2, 3)),
        "k": rng.choice((1, 16, 64, 512, 2048)),
        "block_size": rng.choice((16, 64)),
        "explicit": rng.random() < 0.3,
        "max_blocks": rng.choice((1, 4, 16, 64)),
    }
    return _slots(name, seed, about=replayable("_slots", name, seed, **params), **params)
