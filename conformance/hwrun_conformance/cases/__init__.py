"""Cases per op family. Each module exposes ``OPS`` (the ops it covers), ``cases(op)`` (the
named cases) and ``fuzz(op, rng, name, seed)`` (one random case from the op's documented
domain, for ``hwrun conformance --fuzz``).

A family's cases are loaded only for ops present in the core's catalogue, so the suite covers
every op that exists and nothing that does not. A fuzz case is named ``fuzz<seed>_<index>`` and
drawn from a generator seeded by (seed, op, index) alone, so the worker process rebuilds it
from its name and a failure replays with the same seed. Its ``about`` is the call that adds it
to the family's named cases.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import re
from collections.abc import Iterable

from hwrun_conformance.case import Case

_FUZZ_NAME = re.compile(r"fuzz(\d+)_(\d+)")

CASE_MODULES: tuple[str, ...] = (
    "kv_write",
    "indexer",
    "topk",
    "sparse_mla",
    "attn",
    "moe",
    "kda",
    "linear",
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


def fuzz_cases(available_ops: Iterable[str], seed: int, count: int) -> dict[str, list[Case]]:
    """``count`` random cases per available op, in catalogue order."""
    available = list(available_ops)
    by_op: dict[str, list[Case]] = {}
    for module_name in CASE_MODULES:
        module = importlib.import_module(f"hwrun_conformance.cases.{module_name}")
        for op in module.OPS:
            if op in available:
                by_op[op] = [_fuzz_case(module, op, seed, index) for index in range(count)]
    return {op: by_op[op] for op in available if op in by_op}


def find_case(op: str, name: str) -> Case:
    """A named case of ``op``, or the fuzz case the name encodes."""
    for module_name in CASE_MODULES:
        module = importlib.import_module(f"hwrun_conformance.cases.{module_name}")
        if op not in module.OPS:
            continue
        fuzz = _FUZZ_NAME.fullmatch(name)
        if fuzz:
            return _fuzz_case(module, op, int(fuzz[1]), int(fuzz[2]))
        for case in module.cases(op):
            if case.name == name:
                return case
    raise LookupError(f"no conformance case {op}/{name}")


def _fuzz_case(module, op: str, seed: int, index: int) -> Case:
    rng = random.Random(f"{seed}/{op}/{index}")
    name = f"fuzz{seed}_{index}"
    case = module.fuzz(op, rng, name, rng.randrange(1 << 31))
    return dataclasses.replace(case, name=name, quick=True)  # builders may prefix a format


def replayable(builder: str, *args, **params) -> str:
    """The call that adds a fuzz case to its family's ``cases(op)`` as a named case."""
    parts = [repr(a) for a in args] + [f"{key}={value!r}" for key, value in params.items()]
    return f"{builder}({', '.join(parts)})"
