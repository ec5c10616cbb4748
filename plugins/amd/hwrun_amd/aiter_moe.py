"""AITER adapter for MXFP4 experts: ``aiter.fused_moe.fused_moe`` with per-1x32 quantization.

Not validated on hardware; the conventions below are tested against a fake ``aiter``
(plugins/amd/tests/fake_aiter.py).

- Weights: hwrun's ``mxfp4`` (packed e2m1, element 2i in the low nibble of byte i: AITER's
  ``fp4x2`` byte order) ``[E, N, K/2]`` with e8m0 scales ``[E, N, K/32]``. AITER's kernels read
  them pre-shuffled: the bytes by ``aiter.ops.shuffle.shuffle_weight(w, layout=(16, 16))``
  (16-row x 32-byte tiles, 16-byte runs), the scales flattened to ``[E * N, K/32]`` and shuffled
  by ``aiter.utility.fp4_utils.e8m0_shuffle`` (padded to 256 rows and 8 columns, 32 x 8 tiles
  permuted). Both are done once per weight and kept while the weight lives.
- ``w13`` rows are ``[gate; up]``: AITER's separated gate mode (``GateMode.SEPARATED``).
- Activations: with SiLU and fp4 weights AITER quantizes the tokens and the intermediate to
  MXFP4 per 32 (a4w4), so only ``activation_mode="a4w4"`` is served. AITER's activation scale
  rounds the block's amax up at a mantissa of 1.75 (``+ 0x200000`` on the bits) before the OCP
  floor; hwrun's a4w4 uses the plain OCP floor, so blocks whose amax mantissa lies in
  [1.75, 2) get twice hwrun's scale: the outputs differ by quantization noise, and the
  conformance tolerance on hardware decides (the fake test measures the gap).
- Expert parallel: the contract's id -1 (a slot served elsewhere) becomes expert 0 with weight
  0 (AITER masks experts with ``expert_mask`` instead); ids int32, weights fp32.
- Shared experts are refused (the checkpoints keep them in bf16, outside the MXFP4 kernel).
- gfx950 only: gfx942 has no FP4 math.
"""

from __future__ import annotations

import weakref

import torch

from hwrun.ops.quantized_weight import QuantizedWeight
from hwrun.registry import OpSpec, dtype_reasons
from hwrun_amd.aiter_library import aiter_function
from hwrun_amd.device_checks import arch_reasons, rocm_reasons

MXFP4_ARCHS = ("gfx950",)
SHUFFLE_LAYOUT = (16, 16)
_SHUFFLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shuffled(weight: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """AITER's pre-shuffled (bytes, scales) of an ``[E, N, K]`` mxfp4 weight, made once."""
    if weight not in _SHUFFLED:
        import aiter

        shuffle_weight = aiter_function("aiter.ops.shuffle:shuffle_weight")
        e8m0_shuffle = aiter_function("aiter.utility.fp4_utils:e8m0_shuffle")
        experts, rows, _ = weight.shape
        data = shuffle_weight(weight.data.view(aiter.dtypes.fp4x2), layout=SHUFFLE_LAYOUT)
        scales = e8m0_shuffle(weight.scales.reshape(experts * rows, -1))
        _SHUFFLED[weight] = (data, scales)
    return _SHUFFLED[weight]


def served_slots(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract's -1 slots as expert 0 with weight 0 (AITER has no unserved id)."""
    unserved = ids < 0
    return ids.masked_fill(unserved, 0).to(torch.int32), weights.float().masked_fill(unserved, 0.0)


def experts(
    x: torch.Tensor,  # [T, D] bfloat16
    w13: QuantizedWeight,  # [E, 2I, D] mxfp4
    w2: QuantizedWeight,  # [E, D, I] mxfp4
    ids: torch.Tensor,  # [T, k] int, -1 = not served here
    weights: torch.Tensor,  # [T, k] float32
    activation_mode: str = "bf16",
    shared_experts: tuple[QuantizedWeight, QuantizedWeight] | None = None,
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # a8w8 only: never valid here
) -> torch.Tensor:  # [T, D] x.dtype
    import aiter

    problems = []
    if activation_mode != "a4w4":
        problems.append(
            f"activation_mode {activation_mode!r}: AITER's SiLU MXFP4 MoE quantizes activations "
            "to MXFP4 (a4w4)"
        )
    if w13.format != "mxfp4" or w2.format != "mxfp4":
        problems.append(f"weights are {w13.format} / {w2.format}; this adapter reads mxfp4")
    if shared_experts is not None:
        problems.append(
            "shared experts are not run by this adapter (they are bf16 in the checkpoints)"
        )
    if quantized is not None:
        problems.append("quantized (e4m3 codes) is an a8w8 input; this adapter runs a4w4")
    if problems:
        raise ValueError("moe.experts (aiter): " + "; ".join(problems))
    fused_moe = aiter_function("aiter.fused_moe:fused_moe")
    w1_data, w1_scales = shuffled(w13)
    w2_data, w2_scales = shuffled(w2)
    topk_ids, topk_weights = served_slots(ids, weights)
    out = fused_moe(
        x.to(torch.bfloat16).contiguous(),
        w1_data,
        w2_data,
        topk_weights,
        topk_ids,
        activation=aiter.ActivationType.Silu,
        quant_type=aiter.QuantType.per_1x32,
        w1_scale=w1_scales,
        w2_scale=w2_scales,
    )
    return out.to(x.dtype)


def _validate(spec: OpSpec) -> list[str]:
    reasons = rocm_reasons(spec) + arch_reasons(spec, MXFP4_ARCHS, "AITER's MXFP4 fused MoE")
    reasons += dtype_reasons(spec, ("bfloat16",), "input")
    weight_format, *modes = spec.formats or (None,)
    if weight_format not in (None, "mxfp4"):
        reasons.append(f"expert weight format {weight_format!r}: this adapter reads mxfp4 only")
    if any(mode != "a4w4" for mode in modes):
        reasons.append(
            f"activation mode(s) {modes}: AITER's SiLU MXFP4 MoE runs a4w4 (MXFP4 activations)"
        )
    return reasons


ADAPTERS = (
    ("moe.experts", experts, _validate,
     "AITER fused_moe, MXFP4 per-1x32 (a4w4), pre-shuffled weights and scales"),
)  # fmt: skip
