"""Cases per op family. Each module exposes ``OPS`` (the ops it covers) and ``cases(op)``.

A family's cases are loaded only for ops present in the core's catalogue, so the suite covers
every op that exists and nothing that does not.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from hwrun_conformance.case import Case

CASE_MODULES: tuple[str, ...] = (
    "kv_write",
    "indexer",
    "topk",
    "sparse_mla",
    "attn",
    "moe",
    "kda",
)


def all_cases(available_ops: Iterable[str]) -> dict[str, list[Case]]:
    """Cases by op, for every available op that a case module covers, in catalogue order."""
    available = list(available_ops)
    by_op: dict[str, list[Case]] = {}
    for module_name in CASE_MODULES:
        module = importlib.import_module(f"hwrun_conformance.cases.{module_name}")
        for op in module.OPS:
            if op in available:
                by_op[op] = list(module.cases(op))
    return {op: by_op[op] for op in available if op in by_op}


def uncovered(available_ops: Iterable[str]) -> list[str]:
    """Catalogue ops that no case module covers (reported, so a new op cannot hide)."""
    covered = set()
    for module_name in CASE_MODULES:
        covered.update(importlib.import_module(f"hwrun_conformance.cases.{module_name}").OPS)
    return [op for op in available_ops if op not in covered]
