"""The model's dense linears: how one is called (``Linear``, ``FusedLinear``) and how the
block-FP8 ones are bound to the engine's resolved op once the ops are known (``bind_linears``).

A ``Linear`` over a plain tensor is a torch product. One over a ``QuantizedWeight`` (block-FP8
as the checkpoint stores it) runs through ``ops["dense.linear"]``, or ``ops["dense.linear_a8w8"]``
with ``--linear-activation-dtype fp8``; weights.py loads them, fused_projections.py joins them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hwrun.ops.linear import A8W8_WEIGHT_FORMATS, quantize_activations
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight
from hwrun.plugins import REFERENCE

if TYPE_CHECKING:
    from hwrun.engine.op_table import OpTable
    from hwrun.engine.weights import ModelWeights

LINEAR_OP = "dense.linear"  # bf16 activations (transformers' numerics)
LINEAR_A8W8_OP = "dense.linear_a8w8"  # activations in e4m3 first (DeepSeek's inference numerics)
FP32_OUT_KERNEL_ROWS = 64  # Fp32Linear: up to this many rows (decode), one Triton launch


@dataclass(frozen=True, eq=False)
class Fp32Linear:
    """``y = x @ weight.T`` in fp32, as the checkpoint's own code computes the MoE router and
    the indexer's head weights: ``F.linear(x.float(), weight.float())``.

    ``weight`` is fp32, or bf16 when :meth:`load` found every value to be a bf16 value on CUDA
    (checkpoints store both in bf16). Then bf16 ``x`` is multiplied as bf16 with fp32 sums and
    an fp32 output: a product of two bf16 values is exact in fp32, so the sums are the fp32
    product's, in the GEMM's own order (as between any two fp32 GEMMs). The fp32 GEMM took
    cuBLAS's SIMT kernel, a split-K sum and a copy of ``x`` to fp32 (~0.3 ms of an 8.5 ms step
    on the H200 at batch 64). Up to ``FP32_OUT_KERNEL_ROWS`` rows (decode) the bf16 product is
    one Triton launch (kernels/triton/fp32_out_gemm.py, which adds its K splits itself), where
    cuBLAS (``torch.mm`` with ``out_dtype``) ran a split-K kernel and a second launch for the
    sum (4.5 + 1.6 us at 64 rows, 31 products a step); more rows (prefill) take that
    ``torch.mm``. On the CPU the weight stays fp32: ``F.linear`` in fp32. Batch-invariant mode
    keeps the fp32 row-by-row path (a GEMM's blocking, hence its order, follows the row count).
    """

    weight: torch.Tensor  # [out, in]

    @classmethod
    def load(cls, weight: torch.Tensor) -> Fp32Linear:
        """From an fp32 ``weight``: held in bf16 where that is exact and the GPU path exists."""
        if weight.is_cuda:
            narrow = weight.to(torch.bfloat16)
            if torch.equal(narrow.float(), weight):
                return cls(narrow)
        return cls(weight)

    def __call__(self, x: torch.Tensor, row_by_row: bool = False) -> torch.Tensor:
        if self.weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16 and not row_by_row:
            rows = x.reshape(-1, x.shape[-1])
            if rows.is_cuda and rows.shape[0] <= FP32_OUT_KERNEL_ROWS:
                # Imported here: Triton is an optional dependency, absent from CPU-only installs.
                from hwrun.kernels.triton.fp32_out_gemm import fp32_out_mm

                flat = fp32_out_mm(rows, self.weight)
            else:
                flat = torch.mm(rows, self.weight.t(), torch.float32)
            return flat.view(*x.shape[:-1], self.weight.shape[0])
        return Linear(self.weight.float())(x.float(), row_by_row)


@dataclass(frozen=True, eq=False)
class Linear:
    """``y = x @ weight.T`` with ``weight [out, in]``.

    A tensor ``weight`` (in the compute dtype) is a plain torch product. A ``QuantizedWeight``
    (block-FP8 as the checkpoint stores it) runs through ``ops["dense.linear"]``, looked up at
    every call (so ``OpTable.replaced`` reaches it); ``ops`` is set by :func:`bind_linears`.
    """

    weight: torch.Tensor | QuantizedWeight
    ops: OpTable | None = None
    op: str = LINEAR_OP  # the op a QuantizedWeight runs through (bind_linears sets it)
    # A plain weight decoded from this block-FP8 format for an a8w8 linear on the CPU reference
    # (bind_linears): x is first quantized as dense.linear_a8w8 defines.
    activations_of: str | None = None

    def __call__(
        self,
        x: torch.Tensor,
        row_by_row: bool = False,
        quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``quantized``: ``x``'s e4m3 codes and scales when the norm that made ``x`` wrote
        them (``dense.linear_a8w8`` then reads them instead of quantizing ``x``); ignored by
        every other kind of linear."""
        if isinstance(self.weight, QuantizedWeight):
            return self._quantized(x, quantized)
        if self.activations_of is not None:
            flat = x.reshape(-1, x.shape[-1])
            x = quantize_activations(flat, self.activations_of).to(x.dtype).view(x.shape)
        if not row_by_row:
            return F.linear(x, self.weight)
        # One matrix-vector product per row: a BLAS picks its blocking by the row count, so
        # only this gives a row the same bits in every batch (batch-invariant mode).
        out = x.new_empty(*x.shape[:-1], self.weight.shape[0])
        flat_in, flat_out = x.reshape(-1, x.shape[-1]), out.view(-1, self.weight.shape[0])
        for row in range(flat_in.shape[0]):
            flat_out[row : row + 1] = F.linear(flat_in[row : row + 1], self.weight)
        return out

    def _quantized(
        self, x: torch.Tensor, quantized: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """All rows in one call, in batch-invariant mode too: the engine then resolves
        ``dense.linear`` to a batch-invariant impl (``resolve_ops``)."""
        if self.ops is None:
            raise RuntimeError(
                f"{self.weight.name}: a {self.weight.format} linear runs through the engine's "
                f"{self.op} op; give it the resolved ops first (bind_linears)"
            )
        given = (
            {"quantized": quantized} if quantized is not None and self.op == LINEAR_A8W8_OP else {}
        )
        out = self.ops[self.op](x.reshape(-1, x.shape[-1]), self.weight, **given)
        return out.view(*x.shape[:-1], self.weight.shape[0])


@dataclass(frozen=True, eq=False)
class FusedLinear:
    """Projections of one input as one product (one launch): ``linear``'s weight holds their rows
    in turn, and the projections themselves (where the weights name them) are views into it;
    ``widths`` are their output widths, in order. Built by ``fused_projections.py``."""

    linear: Linear
    widths: tuple[int, ...]

    def __call__(
        self,
        x: torch.Tensor,
        row_by_row: bool = False,
        quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return self.linear(x, row_by_row, quantized).split(self.widths, dim=-1)


def _map_linears(obj: Any, fn: Callable[[Linear], Linear]) -> Any:
    """``obj`` (the weights' dataclasses and tuples) with every Linear replaced by ``fn`` of it."""
    if isinstance(obj, Linear):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_linears(item, fn) for item in obj)
    if is_dataclass(obj) and not isinstance(obj, (type, QuantizedWeight)):
        return replace(obj, **{f.name: _map_linears(getattr(obj, f.name), fn) for f in fields(obj)})
    return obj


def _linears(obj: Any) -> Iterator[Linear]:
    """Every Linear in ``obj`` (the weights' dataclasses and tuples)."""
    if isinstance(obj, Linear):
        yield obj
    elif isinstance(obj, tuple):
        for item in obj:
            yield from _linears(item)
    elif is_dataclass(obj) and not isinstance(obj, (type, QuantizedWeight)):
        for f in fields(obj):
            yield from _linears(getattr(obj, f.name))


def quantized_linear_formats(weights: ModelWeights) -> tuple[str, ...]:
    """The formats of the linears that run through ``dense.linear`` (none: ``()``)."""
    found = {lin.weight.format for lin in _linears(weights) if _is_quantized(lin)}
    return tuple(sorted(found))


def a8w8_reasons(weights: ModelWeights) -> list[str]:
    """Why the quantized linears cannot run through ``dense.linear_a8w8`` (none: ``[]``)."""
    misfits = sorted(
        {
            f"{lin.weight.name} ({lin.weight.format}, {lin.weight.shape[1]} columns)"
            for lin in _linears(weights)
            if _is_quantized(lin)
            and (lin.weight.format not in A8W8_WEIGHT_FORMATS or lin.weight.shape[1] % FP8_BLOCK)
        }
    )
    if not misfits:
        return []
    return [
        f"--linear-activation-dtype fp8 multiplies e4m3 activations in groups of {FP8_BLOCK} "
        f"columns by block-FP8 weights, which {', '.join(misfits)} are not; use "
        "--linear-activation-dtype bf16 for this checkpoint"
    ]


def _is_quantized(linear: Linear) -> bool:
    return isinstance(linear.weight, QuantizedWeight)


def bind_linears(
    weights: ModelWeights, ops: OpTable, dtype: torch.dtype, op: str = LINEAR_OP
) -> ModelWeights:
    """The quantized linears made callable once the ops are resolved: each calls ``ops[op]``
    (``dense.linear``, or ``dense.linear_a8w8``). Except where the reference serves it in an
    fp32 engine (the CPU): the reference would decode every weight on every call, so each is
    decoded here once, to fp32 as the reference decodes it, and runs as a plain torch product
    (the reference's sums, in the BLAS's order; a8w8: after the reference's quantization of x)."""
    if not quantized_linear_formats(weights):
        return weights
    choice = next(c for c in ops.choices if c.op == op)
    decode = choice.platform == REFERENCE and dtype == torch.float32

    def bind(linear: Linear) -> Linear:
        if not _is_quantized(linear):
            return linear
        if decode:
            fmt = linear.weight.format if op == LINEAR_A8W8_OP else None
            return Linear(linear.weight.dequantize(), activations_of=fmt)
        return replace(linear, ops=ops, op=op)

    return _map_linears(weights, bind)
