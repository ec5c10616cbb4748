"""DeepGEMM adapter for ``dense.linear_a8w8`` (``fp8_gemm_nt``, Hopper).

The op quantizes ``x`` per token and 128 columns to e4m3 and multiplies it by the block-FP8
weight: what DeepGEMM's ``fp8_gemm_nt`` takes (DeepSeek's ``act_quant`` then ``fp8_gemm``).
Conventions converted to the contract:
- ``x`` is quantized by the Triton tier's quantizer (byte-exact to ``hwrun.formats``), with its
  scales written tokens first and 16-byte aligned (``token_major_scales``): the layout DeepGEMM's
  SM90 kernel reads through TMA. Given row-major scales, DeepGEMM transposes them first, one
  more launch per GEMM.
- the weight's codes are viewed as ``float8_e4m3fn`` and its fp32 block scales passed as they
  are (``[ceil(R/128), C/128]``, what the SM90 kernel takes for 128 x 128 weight blocks).
  ``fp8_block128_ue8m0`` weights keep e8m0 bytes, which this kernel does not read: they, and
  Blackwell (whose kernel takes packed ue8m0 scales), are refused.
- numerics: e4m3 x e4m3 products on the tensor cores, each 128-wide K step summed there (at
  their accumulation precision, which the contract allows: ``hwrun.ops.linear``), scaled by
  ``x_scale * w_scale`` into an fp32 accumulator, one rounding to bf16.

Row counts: a few-row call is a matrix-vector product where the Triton kernel splits K across
the SMs: on the H200 (docs/benchmarks.md, 2026-12-04) at 1 and 8 rows its whole call, quantizer
included, took 0.94-1.38x DeepGEMM's GEMM alone, to which this adapter adds the quantizer's
launch (2-3 us): Triton is faster on two of the bench model's three projections at 8 rows,
DeepGEMM on o_proj; from 16 rows DeepGEMM's adapter wins on two of the three, from 32 on all.
Calls of fewer than ``DEEPGEMM_MIN_ROWS`` rows, and weights whose row count DeepGEMM's output
tiles do not cover evenly (``R % 64``), are computed by the Triton kernel: the same op, so a
caller sees one impl whose speed follows the row count.
"""

from __future__ import annotations

import torch

from hwrun.kernels.triton.activation_quant import quantize_activations
from hwrun.ops.linear import check_linear_a8w8_args
from hwrun.ops.quantized_weight import QuantizedWeight
from hwrun.registry import OpImpl, OpRegistry, OpSpec, dtype_reasons, format_reasons
from hwrun_nvidia.device_checks import cuda_reasons, importable

# Below this many rows the Triton kernel's split-K GEMV is faster (bench/linear_gpu.py).
DEEPGEMM_MIN_ROWS = 16
# DeepGEMM's output tiles are 64 or more rows of the weight wide.
WEIGHT_ROW_MULTIPLE = 64


def _validate(spec: OpSpec) -> list[str]:
    reasons = []
    if not importable("deep_gemm"):
        reasons.append("DeepGEMM is not installed (pip install tokenspeed-deepgemm)")
    reasons += cuda_reasons(spec, min_sm=90)
    if spec.arch is not None and spec.arch.startswith("sm_") and not spec.arch.startswith("sm_90"):
        reasons.append(
            f"DeepGEMM's fp32-scale fp8 GEMM is its sm_90 kernel; the device is {spec.arch} "
            "(Blackwell's takes packed ue8m0 scales)"
        )
    reasons += format_reasons(spec, ("fp8_block128",), "weight")
    reasons += dtype_reasons(spec, ("bfloat16",), "input")
    return reasons


def uses_deepgemm(rows: int, weight: QuantizedWeight) -> bool:
    """Whether a call of ``rows`` rows over ``weight`` goes to DeepGEMM (else to Triton)."""
    return rows >= DEEPGEMM_MIN_ROWS and weight.shape[0] % WEIGHT_ROW_MULTIPLE == 0


def linear_a8w8(
    x: torch.Tensor,  # [T, C] bfloat16, C a multiple of 128
    weight: QuantizedWeight,  # [R, C] fp8_block128
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # x's codes and scales
) -> torch.Tensor:  # [T, R] bfloat16
    """``hwrun.ops.linear.linear_a8w8``: the quantizer's launch (none when ``quantized`` is
    given: DeepGEMM reads its scales in place when they are in its layout, and transposes them
    otherwise), then DeepGEMM's GEMM (shape checks only, nothing here reads a device value)."""
    check_linear_a8w8_args(x, weight, quantized)
    if not uses_deepgemm(x.shape[0], weight):
        from hwrun.kernels.triton.linear import linear_a8w8 as triton_linear_a8w8

        return triton_linear_a8w8(x, weight, quantized=quantized)
    if x.dtype != torch.bfloat16 or weight.format != "fp8_block128":
        raise ValueError(
            f"dense.linear_a8w8 (deepgemm): takes bf16 x and fp8_block128 weights, got "
            f"{x.dtype} and {weight.format} ({weight.name}); run it through the triton impl"
        )
    import deep_gemm

    if quantized is None:
        quantized = quantize_activations(x, ue8m0=False, token_major_scales=True)
    codes, scales = quantized
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.bfloat16, device=x.device)
    data = weight.data if weight.data.is_contiguous() else weight.data.contiguous()
    deep_gemm.fp8_gemm_nt(
        (codes.view(torch.float8_e4m3fn), scales),
        (data.view(torch.float8_e4m3fn), weight.scales.contiguous()),
        out,
    )
    return out


def register(registry: OpRegistry) -> None:
    if not importable("deep_gemm"):
        return
    registry.register(
        OpImpl(
            op="dense.linear_a8w8",
            name="deepgemm",
            platform=registry.platform,
            fn=linear_a8w8,
            # The quantizer and the GEMM only launch kernels (DeepGEMM compiles a shape's
            # kernel at its first call, so the engine's warm-up step runs before capture);
            # test_adapters_gpu.py checks a replay against eager.
            graph_safe=True,
            # DeepGEMM's tiles follow the row count, and so does the Triton kernel's split.
            batch_invariant=False,
            validate=_validate,
            priority=20,
            description=f"DeepGEMM fp8_gemm_nt (sm_90, fp8_block128) from {DEEPGEMM_MIN_ROWS} "
            "rows; fewer rows through the Triton kernel",
        )
    )
