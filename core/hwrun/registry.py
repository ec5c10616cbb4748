"""Op registry: implementations, validation with reasons, selection, explicit fallback.

Every platform gets its own :class:`OpRegistry`. Selection asks each implementation why it
cannot serve a spec (``validate(spec) -> list[str]``) and keeps the answers, so a refusal always
lists every impl's reasons and ``hwrun ops`` can show them.
"""

from __future__ import annotations

from collections.abc import Callable
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


@dataclass(frozen=True)
class Selection:
    """The outcome of choosing an impl: which one, whether it is a fallback, who said no."""

    impl: OpImpl
    fallback: bool  # True when the platform itself could not serve the op
    rejected: dict[str, list[str]] = field(default_factory=dict)  # impl -> reasons


class OpRegistry:
    """A platform's implementations, with an optional fallback registry (the reference)."""

    def __init__(self, platform: str, fallback: OpRegistry | None = None):
        self.platform = platform
        self.fallback = fallback
        self._impls: dict[str, dict[str, OpImpl]] = {}

    def register(self, impl: OpImpl) -> None:
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


def _reasons_of(impl: OpImpl, spec: OpSpec) -> list[str]:
    """An impl's reasons, with a validator that itself raises turned into a reason."""
    try:
        return list(impl.validate(spec))
    except Exception as exc:  # a broken validator must not take selection down with it
        return [f"validate() raised {type(exc).__name__}: {exc}"]
