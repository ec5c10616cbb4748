"""The contract of an op: its name, its pure-PyTorch reference and the spec `hwrun ops` checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hwrun.registry import OpSpec, _no_reasons


@dataclass(frozen=True)
class OpContract:
    """One catalogue entry.

    ``reference`` defines the op: every implementation takes the same arguments and must match
    it within the tolerance the conformance suite sets for the op and format. Its docstring is
    the op's documentation (shapes with the glossary's dimension names, conventions, errors).
    ``default_spec`` is the typical call (the models' shapes) that ``hwrun ops`` validates each
    platform against. ``reference_validate`` says when even the reference cannot serve a spec.
    """

    name: str
    summary: str
    reference: Callable[..., Any]
    default_spec: OpSpec
    reference_validate: Callable[[OpSpec], list[str]] = field(default=_no_reasons)
