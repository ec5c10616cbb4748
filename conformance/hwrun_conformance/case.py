"""The case model: what one conformance case generates, runs and compares.

A :class:`Case` is static data (op, name, seed, the :class:`~hwrun.registry.OpSpec` that impls
validate against) plus a ``build`` function that turns a seeded generator into a :class:`Sample`:
the op's keyword arguments, which of them the op writes in place, and how its outputs are named.
Each named output has a :class:`Check` saying which metric compares it with the reference.

Cases are plain Python, rebuilt from (op, name) inside the worker process, so nothing but names
and numbers crosses the process boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hwrun.registry import OpSpec

ACCURACY = "accuracy"  # outputs against the reference
PADDING = "padding"  # outputs unchanged when ignored inputs (padding, masked slots) change
BATCH = "batch"  # a row's outputs bitwise identical alone and inside the full batch
KINDS = (ACCURACY, PADDING, BATCH)
BATCH_METRIC = "batch_invariance"  # a BATCH case's bitwise check: rows alone vs the full batch


@dataclass(frozen=True)
class Check:
    """How one output is compared with the reference's.

    ``metric`` names a function of :mod:`hwrun_conformance.metrics`. ``context`` pulls what the
    metric needs besides the two outputs out of the sample's arguments (top-k needs the scores and
    row bounds it ranked). ``tolerance_key`` picks the row of the tolerance table; by default the
    case's format (or dtype). ``canonical`` maps an output to the form the padding and batch
    tiers compare bit for bit, where the contract leaves something free (top-k: the order of a
    row's indices, so each row is sorted); None compares the output as it is.
    """

    metric: str
    context: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    tolerance_key: str | None = None
    canonical: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class RowSplit:
    """Which arguments and outputs carry independent rows, and along which dim.

    Used by the batch-invariance tier: ``args`` maps an argument name to its row dim (arguments
    not named are shared by every row, e.g. a cache or expert weights); ``outputs`` maps an
    output name to its row dim.
    """

    args: Mapping[str, int]
    outputs: Mapping[str, int]


@dataclass
class Sample:
    """One set of inputs and what the op produces from them.

    ``outputs`` names the op's results: a returned tensor, the items of a returned tuple in order,
    or (for in-place ops returning None) the arguments listed in ``inplace``, which the runner
    allocates inside guard bytes and compares after the call. ``perturb_padding`` returns a copy of
    the arguments with every value the contract says is ignored changed (PADDING cases).
    ``unpack`` turns a structured result (a QuantizedWeight) into the outputs' tuple.
    """

    kwargs: dict[str, Any]
    outputs: tuple[str, ...]
    inplace: tuple[str, ...] = ()
    perturb_padding: Callable[[dict[str, Any], torch.Generator], dict[str, Any]] | None = None
    rows: RowSplit | None = None
    unpack: Callable[[Any], tuple[Any, ...]] | None = None  # a structured result -> outputs


@dataclass(frozen=True)
class Case:
    """One conformance case of one op.

    ``must_pass`` cases decide conformance; an advisory case that misses its tolerance is a
    QUALITY_WARNING. ``quick`` cases are the ``--quick`` subset. ``about`` says which edge of the
    contract the case covers; it is printed in reports.
    """

    op: str
    name: str
    spec: OpSpec
    build: Callable[[torch.Generator], Sample] = field(compare=False, repr=False)
    checks: Mapping[str, Check] = field(compare=False, repr=False)
    seed: int = 0
    kind: str = ACCURACY
    quick: bool = True
    must_pass: bool = True
    about: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"case {self.op}/{self.name}: kind {self.kind!r} is not one of {KINDS}"
            )

    @property
    def case_id(self) -> str:
        return f"{self.op}/{self.name}"

    @property
    def format_key(self) -> str:
        """The tolerance-table key: the first storage format, else the dtype, else "any"."""
        if self.spec.formats:
            return self.spec.formats[0]
        return self.spec.dtype or "any"

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


def variants(
    case: Case, *, padding: bool = False, batch: bool = False, quick_siblings: bool = True
) -> list[Case]:
    """``case`` plus its PADDING and BATCH siblings (same inputs, other checks).

    ``quick_siblings=False`` keeps the siblings out of ``--quick`` (a family whose accuracy cases
    repeat per format checks the invariances on one format in quick mode).
    """
    out = [case]
    if padding:
        out.append(_sibling(case, PADDING, quick_siblings))
    if batch:
        out.append(_sibling(case, BATCH, quick_siblings))
    return out


def _sibling(case: Case, kind: str, quick: bool) -> Case:
    return Case(
        op=case.op,
        name=f"{case.name}.{kind}",
        spec=case.spec,
        build=case.build,
        checks=case.checks,
        seed=case.seed,
        kind=kind,
        quick=case.quick and quick,
        must_pass=case.must_pass,
        about=f"{kind} invariance of {case.name}",
    )
