"""Which impl serves each op the engine calls, chosen once at startup for the model's shapes.

The engine never calls a kernel: it calls the op contracts through this table. Startup builds one
:class:`~hwrun.registry.OpSpec` per op from the model's real shapes and formats on the Target,
asks the platform's registry, and refuses, listing every reason of every op at once, when an op
cannot be served (or only by the reference while fallback is disallowed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from hwrun.engine.model_config import ModelConfig
from hwrun.errors import ReasonsError, UnsupportedError
from hwrun.ops.indexer import INDEX_HEAD_DIM
from hwrun.ops.sparse_mla import QK_DIM, V_DIM
from hwrun.registry import OpRegistry, OpSpec, Selection

# Every op the DeepseekV32 graph calls, in the order a layer calls them.
ENGINE_OPS: tuple[str, ...] = (
    "dense.linear",  # with block-FP8 projections only: the linears kept in FP8 ...
    "dense.linear_a8w8",  # ... or this one instead, with --linear-activation-dtype fp8
    "kv.write_latent",
    "kv.write_index_keys",
    "indexer.logits_ragged",
    "indexer.logits_paged",
    "indexer.topk",
    "indexer.to_slots",
    "sparse_mla.prefill",
    "sparse_mla.decode",
    "moe.route",
    "moe.experts",
    "attn.lse_combine",  # under decode context parallelism only: the ranks' partial attention
)


class EngineStartupError(ReasonsError):
    """The engine cannot start for this model on this platform; ``reasons`` has them all."""


@dataclass(frozen=True)
class OpChoice:
    """What serves one op: the impl's name and platform, and whether it is a fallback."""

    op: str
    impl: str
    platform: str
    fallback: bool
    description: str = ""


@dataclass(frozen=True)
class ModelFormats:
    """The storage formats and shapes a model's ops run with."""

    dtype: str  # activation dtype (torch name)
    latent_format: str
    index_format: str
    expert_format: str  # moe.experts weight format
    block_size: int
    index_query_fp8: bool = False  # the indexer's queries in e4m3 (else the activation dtype)
    linear_formats: tuple[str, ...] = ()  # dense.linear weight formats (block-FP8 projections)
    linear_a8w8: bool = False  # those linears through dense.linear_a8w8 (activations in e4m3)
    expert_activation_mode: str = "bf16"  # moe.experts' activation mode: bf16, or a8w8

    @property
    def linear_op(self) -> str:
        return "dense.linear_a8w8" if self.linear_a8w8 else "dense.linear"

    @property
    def index_query_dtype(self) -> str:
        return "float8_e4m3fn" if self.index_query_fp8 else self.dtype


def engine_op_specs(
    config: ModelConfig,
    formats: ModelFormats,
    device_type: str,
    arch: str | None,
    decode_context_parallel: int = 1,
) -> list[OpSpec]:
    """One spec per engine op, with the model's real shapes and formats on the device (with
    ``decode_context_parallel`` > 1, also the merge of the ranks' partial attention)."""
    common = {"device_type": device_type, "arch": arch}
    index = {"formats": (formats.index_format,), "head_dim": INDEX_HEAD_DIM}
    attention = {"num_heads": config.num_heads, "head_dim": QK_DIM, "topk": config.index_topk}
    specs = [
        OpSpec("kv.write_latent", formats.dtype, (formats.latent_format,),
               block_size=formats.block_size),
        OpSpec("kv.write_index_keys", formats.dtype, block_size=formats.block_size, **index),
        OpSpec("indexer.logits_ragged", formats.index_query_dtype,
               num_heads=config.index_n_heads, **index),
        OpSpec("indexer.logits_paged", formats.index_query_dtype, num_heads=config.index_n_heads,
               block_size=formats.block_size, **index),
        OpSpec("indexer.topk", "float32", topk=config.index_topk),
        OpSpec("indexer.to_slots", block_size=formats.block_size, topk=config.index_topk),
        OpSpec("sparse_mla.prefill", formats.dtype, **attention),
        OpSpec("sparse_mla.decode", formats.dtype, (formats.latent_format,),
               block_size=formats.block_size, **attention),
        OpSpec("moe.route", "float32", topk=config.num_experts_per_tok),
        OpSpec("moe.experts", formats.dtype,
               (formats.expert_format, formats.expert_activation_mode),
               topk=config.num_experts_per_tok),
    ]  # fmt: skip
    if formats.linear_formats:
        specs.insert(0, OpSpec(formats.linear_op, formats.dtype, formats.linear_formats))
    if decode_context_parallel > 1:
        # dcp.lse_combine merges the ranks' parts in fp32 (they travel as one fp32 tensor)
        specs.append(
            OpSpec("attn.lse_combine", "float32", num_heads=config.num_heads, head_dim=V_DIM)
        )
    return [replace(spec, **common) for spec in specs]


class OpTable:
    """The selected impl of every engine op; ``table["op"](...)`` calls it."""

    def __init__(self, selections: dict[str, Selection]):
        self._selections = selections
        self._fns: dict[str, Callable[..., Any]] = {op: s.impl.fn for op, s in selections.items()}

    def __getitem__(self, op: str) -> Callable[..., Any]:
        return self._fns[op]

    @property
    def ops(self) -> list[str]:
        return list(self._fns)

    @contextmanager
    def replaced(self, replacements: dict[str, Callable[..., Any]]) -> Iterator[None]:
        """Serve some ops with other callables inside the block (tests, profiling), then put
        the selected impls back."""
        saved = {op: self._fns[op] for op in replacements}
        self._fns.update(replacements)
        try:
            yield
        finally:
            self._fns.update(saved)

    @property
    def choices(self) -> list[OpChoice]:
        return [
            OpChoice(op, s.impl.name, s.impl.platform, s.fallback, s.impl.description)
            for op, s in self._selections.items()
        ]

    def graph_safe(self, op: str) -> bool:
        return self._selections[op].impl.graph_safe


def resolve_ops(
    registry: OpRegistry,
    specs: list[OpSpec],
    allow_fallback: bool,
    what: str,
    batch_invariant: bool = False,
) -> OpTable:
    """Select every op; raise EngineStartupError with every op's reasons when any is unserved.

    With ``batch_invariant``, an op whose best impl is not batch-invariant runs on the
    platform's fallback (the reference, which is), reported as a fallback.
    """
    selections: dict[str, Selection] = {}
    reasons: list[str] = []
    for spec in specs:
        try:
            selection = registry.select(spec, allow_fallback=allow_fallback)
        except UnsupportedError as err:
            detail = "; ".join(f"{impl}: {', '.join(r)}" for impl, r in err.reasons.items())
            reasons.append(f"{spec.op}: nothing can serve it ({detail or err})")
            continue
        if batch_invariant and not selection.impl.batch_invariant:
            selection = _batch_invariant_fallback(registry, spec, selection, allow_fallback)
            if selection is None:
                reasons.append(
                    f"{spec.op}: --batch-invariant needs a batch-invariant impl; "
                    f"{registry.platform}'s is not and the reference fallback is off"
                )
                continue
        selections[spec.op] = selection
    if reasons:
        if not allow_fallback:
            reasons.append(
                "the reference fallback is off (--no-fallback / HWRUN_REFERENCE_FALLBACK=0); "
                "allow it, or choose a platform whose impls accept these shapes and formats"
            )
        raise EngineStartupError(f"{what} cannot start", reasons)
    return OpTable(selections)


def _batch_invariant_fallback(
    registry: OpRegistry, spec: OpSpec, chosen: Selection, allow_fallback: bool
) -> Selection | None:
    if not allow_fallback or registry.fallback is None:
        return None
    inner = registry.fallback.select(spec, allow_fallback=False)
    if not inner.impl.batch_invariant:
        return None
    rejected = {**chosen.rejected, chosen.impl.name: ["not batch-invariant (--batch-invariant)"]}
    return Selection(inner.impl, fallback=True, rejected=rejected)
