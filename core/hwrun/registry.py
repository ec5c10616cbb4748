"""Op registry: implementations, validation with reasons, selection, explicit fallback.

Every platform gets its own :class:`OpRegistry`. Selection asks each implementation why it
cannot serve a spec (``validate(spec) -> list[str]``) and keeps the answers, so a refusal always
lists every impl's reasons and ``hwrun ops`` can show them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hwrun.errors import UnsupportedError


@dataclass(frozen=True)
class OpSpec:
    """What validation needs to know about one call of an op.

    Only ``op`` is required; an impl that needs a field that is None treats it as unknown and
    validates what it can.
    """

    op: str  # catalogue name, e.g. "indexer.logits_paged"
    dtype: str | None = None  # activation / query dtype (torch name, e.g. "bfloat16")
    formats: tuple[str, ...] = ()  # storage formats involved, e.g. ("fp8_ds_mla",) or ("fp8",)
    num_heads: int | None = None
    head_dim: int | None = None
    block_size: int | None = None
    topk: int | None = None
    device_type: str = "cpu"  # torch device type of the tensors ("cpu", "cuda", ...)
    arch: str | None = None  # device architecture, e.g. "sm_90", "gfx942"


def _no_reasons(spec: OpSpec) -> list[str]:
    return []


def format_reasons(spec: OpSpec, supported: tuple[str, ...], what: str) -> list[str]:
    """The spec's formats that an impl serving only ``supported`` cannot take, as a reason."""
    unsupported = [f for f in spec.formats if f not in supported]
    if unsupported:
        return [f"{what} format(s) {unsupported} not supported here; supported: {list(supported)}"]
    return []


def dtype_reasons(spec: OpSpec, supported: tuple[str, ...], what: str) -> list[str]:
    """The spec's dtype, when an impl serving only ``supported`` cannot take it, as a reason."""
    if spec.dtype is not None and spec.dtype not in supported:
        return [f"{what} dtype {spec.dtype} not supported here; supported: {list(supported)}"]
    return []


@dataclass(frozen=True)
class OpImpl:
    """One implementation of one op. ``fn`` takes the op's documented arguments."""

    op: str
    name: str  # unique within its platform and op, e.g. "triton", "deepgemm", "reference"
    platform: str
    fn: Callable[..., Any]
    validate: Callable[[OpSpec], list[str]] = _no_reasons
    priority: int = 0  # higher wins among valid impls
    description: str = ""
    # (optional, defaults to False) Safe to capture in a CUDA graph: no host synchronisation
    # (no .item(), .tolist(), data-dependent shapes) and no allocation whose size depends on
    # the data. The engine captures a decode step only when every impl it calls says so.
    graph_safe: bool = False
    # (optional, defaults to False) A row's result never depends on the rest of the batch (same
    # bits alone or batched); the engine's --batch-invariant mode uses only such impls.
    batch_invariant: bool = False


@dataclass(frozen=True)
class Selection:
    """The outcome of choosing an impl: which one, whether it is a fallback, who said no."""

    impl: OpImpl
    fallback: bool  # True when the platform itself could not serve the op
    rejected: dict[str, list[str]] = field(default_factory=dict)  # impl -> reasons


class OpRegistry:
    """A platform's implementations, with an optional fallback registry (the reference).

    ``known_ops``, when given (the plugin set passes the catalogue's names), is the set of op
    names an impl may register under; any other name is refused with the closest known ones.
    """

    def __init__(
        self,
        platform: str,
        fallback: OpRegistry | None = None,
        known_ops: Iterable[str] | None = None,
    ):
        self.platform = platform
        self.fallback = fallback
        self.known_ops = None if known_ops is None else frozenset(known_ops)
        self._impls: dict[str, dict[str, OpImpl]] = {}

    def register(self, impl: OpImpl) -> None:
        """Add ``impl``; a malformed impl, an unknown op or a duplicate name raises, saying
        what to change."""
        _check_impl(impl)
        if self.known_ops is not None and impl.op not in self.known_ops:
            close = difflib.get_close_matches(impl.op, sorted(self.known_ops), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see `hwrun ops`"
            raise ValueError(
                f"impl {impl.name!r} registers unknown op {impl.op!r}; "
                f"register under a catalogue op name ({hint})"
            )
        if impl.platform != self.platform:
            raise ValueError(
                f"impl {impl.name!r} for {impl.op!r} says platform {impl.platform!r} but is "
                f"registered on {self.platform!r}; register it with platform={self.platform!r}"
            )
        by_name = self._impls.setdefault(impl.op, {})
        if impl.name in by_name:
            raise ValueError(
                f"{self.platform}: op {impl.op!r} already has an impl named {impl.name!r}; "
                "give each impl of an op a distinct name"
            )
        by_name[impl.name] = impl

    def ops(self) -> list[str]:
        return sorted(self._impls)

    def impls(self, op: str) -> list[OpImpl]:
        """Impls of ``op``, best first (priority, then name for a stable order)."""
        return sorted(self._impls.get(op, {}).values(), key=lambda i: (-i.priority, i.name))

    def select(
        self, spec: OpSpec, pinned: str | None = None, allow_fallback: bool = True
    ) -> Selection:
        """Choose the impl that serves ``spec``.

        A ``pinned`` impl that cannot serve the spec raises with its reasons (no fallback: the
        user asked for it by name). Otherwise the best valid impl wins; if none is valid and
        ``allow_fallback`` is set, the fallback registry is asked and the result is marked as a
        fallback; else :class:`UnsupportedError` lists every impl's reasons.
        """
        candidates = self.impls(spec.op)
        if pinned is not None:
            chosen = [impl for impl in candidates if impl.name == pinned]
            if not chosen:
                known = ", ".join(impl.name for impl in candidates) or "none"
                raise UnsupportedError(
                    f"{self.platform}: no impl named {pinned!r} for {spec.op!r} "
                    f"(impls of this op here: {known})"
                )
            reasons = _reasons_of(chosen[0], spec)
            if reasons:
                raise UnsupportedError(
                    f"{self.platform}: pinned impl {pinned!r} cannot serve {spec.op!r}",
                    {pinned: reasons},
                )
            return Selection(chosen[0], fallback=False)

        rejected: dict[str, list[str]] = {}
        for impl in candidates:
            reasons = _reasons_of(impl, spec)
            if not reasons:
                return Selection(impl, fallback=False, rejected=rejected)
            rejected[impl.name] = reasons
        if not candidates:
            rejected[f"{self.platform}:*"] = [f"the {self.platform} platform does not implement it"]

        if allow_fallback and self.fallback is not None:
            try:
                inner = self.fallback.select(spec, allow_fallback=False)
            except UnsupportedError as err:
                rejected.update(
                    {f"{self.fallback.platform}:{k}": v for k, v in err.reasons.items()}
                )
            else:
                return Selection(inner.impl, fallback=True, rejected=rejected)
        raise UnsupportedError(f"{self.platform}: no impl can serve {spec.op!r}", rejected)


def _check_impl(impl: object) -> None:
    """An impl's fields must have the types selection relies on."""
    if not isinstance(impl, OpImpl):
        raise TypeError(
            f"register() takes an hwrun.registry.OpImpl, got {type(impl).__name__}; "
            "build one with OpImpl(op=..., name=..., platform=registry.platform, fn=...)"
        )
    problems = []
    if not isinstance(impl.op, str) or not impl.op:
        problems.append(f"op must be a catalogue op name, got {impl.op!r}")
    if not isinstance(impl.name, str) or not impl.name:
        problems.append(f"name must be a non-empty str, got {impl.name!r}")
    if not callable(impl.fn):
        problems.append(f"fn must be callable, got {type(impl.fn).__name__}")
    if not callable(impl.validate):
        problems.append(f"validate must be callable, got {type(impl.validate).__name__}")
    if not isinstance(impl.priority, int) or isinstance(impl.priority, bool):
        problems.append(f"priority must be an int, got {impl.priority!r}")
    if problems:
        raise TypeError(f"malformed OpImpl {impl.name!r} for {impl.op!r}: {'; '.join(problems)}")


def _reasons_of(impl: OpImpl, spec: OpSpec) -> list[str]:
    """An impl's reasons, with a validator that raises or answers something other than a list
    of str turned into a reason."""
    try:
        answer = impl.validate(spec)
    except Exception as exc:  # a broken validator must not take selection down with it
        return [f"validate() raised {type(exc).__name__}: {exc}"]
    if not isinstance(answer, list | tuple) or not all(isinstance(r, str) for r in answer):
        return [f"validate() returned {type(answer).__name__}, not a list of reasons (plugin bug)"]
    return list(answer)
