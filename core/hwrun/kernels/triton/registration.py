"""The portable Triton tier as registrable impls, shared by the vendor plugins.

What a kernel itself can compute (formats, dtypes, head dim, block sizes) is the same on every
vendor and lives here, in ``TritonKernel.limits``. What a device adds (is there one, is its
architecture new enough, does it compute OCP fp8) is the plugin's: it passes
``device_reasons(spec, kernel)``, answered from the two facts a kernel states about a spec
(``fp8_dot``: it multiplies in fp8; ``reads_e4m3fn``: it converts OCP e4m3fn codes through
Triton's fp8 type). :func:`host_reasons` is the part every plugin shares: Triton must be
installed, and CPU tensors run only in Triton's interpreter (``TRITON_INTERPRET=1``).
A plugin registers and claims the whole tier through one :class:`TritonTier`.

The host functions (host_calls.py) import their kernel module at the first call, so loading a
plugin imports neither Triton nor the kernels.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwrun import knobs
from hwrun.kernels.triton import host_calls
from hwrun.ops.linear import A8W8_WEIGHT_FORMATS, LINEAR_WEIGHT_FORMATS
from hwrun.registry import OpImpl, OpRegistry, OpSpec, dtype_reasons, format_reasons

if TYPE_CHECKING:
    from hwrun.target import Target

TRITON_PRIORITY = 10  # under vendor-library adapters (20), over nothing: the portable floor
INDEX_KEY_FORMATS = ("fp8", "mxfp4")
QUERY_DTYPES = ("float8_e4m3fn", "bfloat16", "float16", "float32")
LATENT_FORMATS_DECODE = ("fp8_ds_mla", "bf16")
INPUT_DTYPES = ("bfloat16", "float16", "float32")
# Kept here, not imported from the kernels' weight_tiles.WEIGHT_FORMATS: this module must not
# import Triton (it registers the tier where Triton may be missing).
EXPERT_WEIGHT_FORMATS = ("bf16", "fp8_block128", "fp8_block128_ue8m0", "int4_g128")


def _never(spec: OpSpec) -> bool:
    return False


@dataclass(frozen=True)
class TritonKernel:
    """One op's portable kernel: the host function and what it can compute."""

    op: str
    fn: Callable[..., Any]
    limits: Callable[[OpSpec], list[str]]  # reasons the kernel itself cannot serve a spec
    description: str
    # Storage formats it reads or writes (the claim's candidates). A tuple entry is claimed as a
    # whole when validate accepts that spec: an activation mode only exists with its weights.
    formats: tuple[str | tuple[str, ...], ...] = ()
    fp8_dot: Callable[[OpSpec], bool] = _never  # multiplies in fp8 (needs fp8 matrix units)
    reads_e4m3fn: Callable[[OpSpec], bool] = _never  # decodes OCP e4m3fn through Triton's fp8
    # By construction on every device: each output element is computed by one program in a
    # fixed order whatever the batch (the conformance BATCH cases check it). Not where the
    # launch grid or an atomic's order depends on the batch.
    batch_invariant: bool = True
    # No host synchronisation and data-independent allocations: a CUDA graph may capture it.
    graph_safe: bool = True


DeviceReasons = Callable[[OpSpec, TritonKernel], list[str]]


def host_reasons(spec: OpSpec) -> list[str]:
    """Reasons shared by every vendor: Triton must import; CPU tensors need the interpreter."""
    reasons = []
    if importlib.util.find_spec("triton") is None:
        reasons.append("Triton is not installed (pip install triton)")
    if spec.device_type == "cpu" and not knobs.triton_interpret():
        reasons.append(
            "tensors are on 'cpu': the Triton kernels need a GPU, or Triton's CPU interpreter "
            "(set TRITON_INTERPRET=1 before hwrun starts)"
        )
    return reasons


def validator(kernel: TritonKernel, device_reasons: DeviceReasons) -> Callable[[OpSpec], list[str]]:
    """The impl's validate: host reasons, the device's (accelerator specs only), the kernel's."""

    def validate(spec: OpSpec) -> list[str]:
        reasons = host_reasons(spec)
        if spec.device_type != "cpu":
            reasons += device_reasons(spec, kernel)
        return reasons + kernel.limits(spec)

    return validate


@dataclass(frozen=True)
class TierClaims:
    ops: frozenset[str]
    formats: frozenset[str]
    features: frozenset[str]  # batch_invariant:<op> per claimed batch-invariant op


def claims_from_validate(
    kernels: Iterable[Any],  # each with .op, .formats, .batch_invariant
    validate_of: Callable[[Any], Callable[[OpSpec], list[str]]],
    target: Target,
) -> TierClaims:
    """What a tier's kernels claim on ``target``, asked of their own validate: an op whose
    validate accepts a spec with only the target's device (and arch) filled in, and each of its
    formats it accepts there (shared by the Triton and Pallas tiers)."""
    ops, formats, features = set(), set(), set()
    for kernel in kernels:
        validate = validate_of(kernel)
        if validate(target.spec(kernel.op)):
            continue
        ops.add(kernel.op)
        if kernel.batch_invariant:
            features.add(f"batch_invariant:{kernel.op}")
        for candidate in kernel.formats:
            spec_formats = candidate if isinstance(candidate, tuple) else (candidate,)
            if not validate(target.spec(kernel.op, formats=spec_formats)):
                formats.update(spec_formats)
    return TierClaims(frozenset(ops), frozenset(formats), frozenset(features))


@dataclass(frozen=True)
class TritonTier:
    """The portable Triton kernels as one platform registers and claims them.

    ``device_reasons`` is the platform's: asked only for specs on an accelerator (CPU specs are
    the interpreter's, see :func:`host_reasons`). ``tuned_for`` ends each impl's description.
    A plugin makes one and calls :meth:`register` from ``hwrun_register_ops`` and
    :meth:`claims` from ``hwrun_capabilities``.
    """

    device_reasons: DeviceReasons
    tuned_for: str

    def kernels(self) -> list[TritonKernel]:
        return [kernel for family in FAMILIES.values() for kernel in family]

    def register(self, registry: OpRegistry) -> None:
        """Register every kernel of the tier as the platform's "triton" impl of its op."""
        for kernel in self.kernels():
            registry.register(
                OpImpl(
                    op=kernel.op,
                    name="triton",
                    platform=registry.platform,
                    fn=kernel.fn,
                    validate=validator(kernel, self.device_reasons),
                    priority=TRITON_PRIORITY,
                    description=f"Triton: {kernel.description} ({self.tuned_for})",
                    graph_safe=kernel.graph_safe,
                    batch_invariant=kernel.batch_invariant,
                )
            )

    def claims(self, target: Target) -> TierClaims:
        """What the tier serves on ``target``, asked of the impls' own validate: an op whose
        validate accepts a spec with only the target's device (and arch) filled in, and each of
        its formats it accepts there. On a CPU target without the interpreter that is nothing,
        so a plugin never claims an op whose every case would be refused."""
        return claims_from_validate(
            self.kernels(), lambda kernel: validator(kernel, self.device_reasons), target
        )


# Limits of each kernel, whatever the device.


def _logits_limits(spec: OpSpec) -> list[str]:
    reasons = format_reasons(spec, INDEX_KEY_FORMATS, "index-key")
    reasons += dtype_reasons(spec, QUERY_DTYPES, "query")
    if spec.head_dim not in (None, 128):
        reasons.append(f"head_dim must be 128, got {spec.head_dim}")
    if spec.block_size is not None and spec.block_size & (spec.block_size - 1):
        reasons.append(f"block_size must be a power of two, got {spec.block_size}")
    return reasons


def _topk_limits(spec: OpSpec) -> list[str]:
    return dtype_reasons(spec, ("float32",), "logits")


def _to_slots_limits(spec: OpSpec) -> list[str]:
    if spec.block_size is not None and spec.block_size <= 0:
        return [f"block_size must be positive, got {spec.block_size}"]
    return []


def _decode_limits(spec: OpSpec) -> list[str]:
    reasons = format_reasons(spec, LATENT_FORMATS_DECODE, "latent")
    reasons += dtype_reasons(spec, ("bfloat16", "float16"), "query")
    if spec.head_dim not in (None, 576):
        reasons.append(f"head_dim must be 576 (absorbed MLA), got {spec.head_dim}")
    return reasons


def _prefill_limits(spec: OpSpec) -> list[str]:
    # q is multiplied in bf16 on the matrix units: an fp32 query would lose its low bits.
    reasons = dtype_reasons(spec, ("bfloat16", "float16"), "query")
    if spec.head_dim not in (None, 576):
        reasons.append(f"head_dim must be 576 (absorbed MLA), got {spec.head_dim}")
    return reasons


def _route_limits(spec: OpSpec) -> list[str]:
    # E is not part of the spec: the host function refuses a router over MAX_EXPERT_LANES.
    reasons = dtype_reasons(spec, INPUT_DTYPES, "router logits")
    if spec.topk is not None and spec.topk <= 0:
        reasons.append(f"topk must be positive, got {spec.topk}")
    return reasons


def _experts_limits(spec: OpSpec) -> list[str]:
    weight_format, *modes = spec.formats or (None,)
    reasons = dtype_reasons(spec, INPUT_DTYPES, "input")
    if weight_format is not None and weight_format not in EXPERT_WEIGHT_FORMATS:
        reasons.append(
            f"expert weight format {weight_format!r} has no kernel here (no in-kernel decode "
            f"of its codes yet); supported: {list(EXPERT_WEIGHT_FORMATS)}"
        )
    unknown = [mode for mode in modes if mode not in ("bf16", "a8w8")]
    if unknown:
        reasons.append(
            f"activation mode(s) {unknown} not supported here: the kernel multiplies bf16 "
            "activations ('bf16') or e4m3 ones against block-FP8 codes ('a8w8')"
        )
    if "a8w8" in modes and weight_format not in (None, "fp8_block128", "fp8_block128_ue8m0"):
        reasons.append(f"activation mode 'a8w8' needs block-FP8 experts, not {weight_format!r}")
    return reasons


def _linear_limits(spec: OpSpec) -> list[str]:
    # x is multiplied in bf16 on the matrix units: an fp32 input would lose its low bits.
    reasons = dtype_reasons(spec, ("bfloat16",), "input")
    return reasons + format_reasons(spec, LINEAR_WEIGHT_FORMATS, "weight")


def _linear_a8w8_limits(spec: OpSpec) -> list[str]:
    # x is quantized from any float, but the engine's GPU activations (and the tests) are bf16.
    reasons = dtype_reasons(spec, ("bfloat16",), "input")
    return reasons + format_reasons(spec, A8W8_WEIGHT_FORMATS, "weight")


def _lse_combine_limits(spec: OpSpec) -> list[str]:
    return dtype_reasons(spec, ("float32", "bfloat16", "float16"), "outs")


def _latent_write_limits(spec: OpSpec) -> list[str]:
    return format_reasons(spec, ("fp8_ds_mla", "bf16"), "latent") + dtype_reasons(
        spec, INPUT_DTYPES, "input"
    )


def _index_key_write_limits(spec: OpSpec) -> list[str]:
    return format_reasons(spec, INDEX_KEY_FORMATS, "index-key") + dtype_reasons(
        spec, INPUT_DTYPES, "input"
    )


def _fp8_queries(spec: OpSpec) -> bool:
    return spec.dtype == "float8_e4m3fn"


def _always(spec: OpSpec) -> bool:
    # Whatever the spec: both index-key formats are decoded as e4m3 (mxfp4's e2m1 values are
    # re-coded as e4m3 bits), and dense.linear_a8w8 always multiplies e4m3 x e4m3.
    return True


def _fp8_latent(spec: OpSpec) -> bool:
    return "fp8_ds_mla" in spec.formats


def _fp8_weights(spec: OpSpec) -> bool:
    return bool(spec.formats) and spec.formats[0].startswith("fp8_block128")


def _a8w8_activations(spec: OpSpec) -> bool:
    return "a8w8" in spec.formats[1:]


def _any_fp8_weights(spec: OpSpec) -> bool:
    return any(fmt.startswith("fp8_block128") for fmt in spec.formats)


FAMILIES: dict[str, tuple[TritonKernel, ...]] = {
    "indexer": (
        TritonKernel(
            "indexer.logits_paged",
            host_calls.logits_paged,
            _logits_limits,
            "fp8 / mxfp4 keys read packed (68 B/token for mxfp4)",
            INDEX_KEY_FORMATS,
            fp8_dot=_fp8_queries,
            reads_e4m3fn=_always,
        ),
        TritonKernel(
            "indexer.logits_ragged",
            host_calls.logits_ragged,
            _logits_limits,
            "fp8 / mxfp4 keys, one key tile against a group of rows",
            INDEX_KEY_FORMATS,
            fp8_dot=_fp8_queries,
            reads_e4m3fn=_always,
            # fp8 rows are scored side by side (default_rows): which neighbours a row has, and
            # its columns in the product, depend on its index in the batch, and in Triton's
            # interpreter the product's rounding depends on the column (conformance's
            # fp8_h4_ties.batch case: 5 of 160 bytes of a row changed). Not claimed until a
            # GPU run shows the compiled kernel invariant.
            batch_invariant=False,
        ),
        TritonKernel(
            "indexer.topk",
            host_calls.topk,
            _topk_limits,
            "threshold from segment maxima, exact select among the candidates in registers "
            "(smallest index wins ties; radix select for k > 4096 and overflowing rows)",
            # Candidates are appended with atomics: the set is fixed, the order is not on a GPU.
            batch_invariant=False,
        ),
        TritonKernel(
            "indexer.to_slots",
            host_calls.to_slots,
            _to_slots_limits,
            "block-table lookup in one launch; -1 for padding, unallocated or past-the-table "
            "positions",
        ),
    ),
    "sparse_mla": (
        TritonKernel(
            "sparse_mla.decode",
            host_calls.decode,
            _decode_limits,
            "rows gathered from the paged cache as stored, online softmax",
            LATENT_FORMATS_DECODE,
            reads_e4m3fn=_fp8_latent,
            # At small batch the top-k list is split into parts (how many depends on the rows),
            # merged by lse_combine: the rounding changes with the batch.
            batch_invariant=False,
        ),
        TritonKernel(
            "sparse_mla.prefill",
            host_calls.prefill,
            _prefill_limits,
            "the decode kernel over the gathered bf16 / fp32 workspace, top-k never split",
        ),
    ),
    "moe": (
        TritonKernel(
            "moe.route",
            host_calls.route,
            _route_limits,
            "one launch: scores, grouped top-2 group scores, top-k by argmax rounds (smallest "
            "id wins ties), renormalized and scaled",
        ),
        TritonKernel(
            "moe.experts",
            host_calls.experts,
            _experts_limits,
            "tokens grouped by expert, gate/up + SiLU-mul and down GEMMs, fp8 block-128 and "
            "W4A16 int4 group-128 codes decoded in the kernel; a8w8: e4m3 x e4m3 products",
            # ue8m0 scales are served but not claimed: the quick conformance suite has no case
            # in that format, and a claim no case exercises is an audit failure.
            ("bf16", "fp8_block128", "int4_g128", ("fp8_block128", "a8w8")),
            fp8_dot=_a8w8_activations,
            reads_e4m3fn=_fp8_weights,
            # Tokens that chose one expert share a GEMM tile: the summation order (and so the
            # rounding) depends on which other tokens are in the batch.
            batch_invariant=False,
        ),
    ),
    "dense": (
        TritonKernel(
            "dense.linear",
            host_calls.linear,
            _linear_limits,
            "block-FP8 codes read as stored and scaled per 128-wide K step; decode rows split "
            "K across the SMs",
            LINEAR_WEIGHT_FORMATS,
            reads_e4m3fn=_any_fp8_weights,
            # The tile shape and the split of K change with the row count, and so does the
            # summation order of a row.
            batch_invariant=False,
        ),
        TritonKernel(
            "dense.linear_a8w8",
            host_calls.linear_a8w8,
            _linear_a8w8_limits,
            "activations quantized per token and 128 columns in one launch, then e4m3 x e4m3 "
            "on the matrix units, both scales per 128-wide K step; decode rows split K",
            A8W8_WEIGHT_FORMATS,
            fp8_dot=_always,
            reads_e4m3fn=_any_fp8_weights,
            batch_invariant=False,  # as dense.linear: tiles and split follow the row count
        ),
    ),
    "attn": (
        TritonKernel(
            "attn.lse_combine",
            host_calls.lse_combine,
            _lse_combine_limits,
            "parts folded in index order, -inf parts add nothing",
        ),
    ),
    "kv": (
        # The writes compute e4m3 / e2m1 bits with integer arithmetic: no fp8 hardware involved.
        TritonKernel(
            "kv.write_latent",
            host_calls.write_latent,
            _latent_write_limits,
            "quantize and scatter in one pass, fp8_ds_mla / bf16 rows",
            ("fp8_ds_mla", "bf16"),
        ),
        TritonKernel(
            "kv.write_index_keys",
            host_calls.write_index_keys,
            _index_key_write_limits,
            "quantize and scatter in one pass, fp8 / mxfp4",
            INDEX_KEY_FORMATS,
        ),
    ),
}
