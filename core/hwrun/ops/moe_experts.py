"""Reference of ``moe.experts``: the routed experts' SwiGLU MLPs over quantized weights.

``out[t] = sum_j weights[t, j] * W2_e (silu(gate) * up)`` with ``e = ids[t, j]`` and
``[gate | up] = W13_e x[t]``, plus the shared experts' MLP added with weight 1.

Numerics (what a fused kernel must match): weights are decoded exactly by ``hwrun.formats``;
both GEMM inputs (the token ``x`` and the intermediate ``silu(gate) * up``) are rounded to the
activation format of ``activation_mode`` and decoded back; products and the sum over the top-k
accumulate in fp32 (a token's experts in ascending id order, then the shared experts); the
result is rounded once to ``x``'s dtype. Every token is computed on its own, so its output does
not depend on the batch it came in (the reference platform's ``batch_invariant`` claim).

- ``bf16``: activations rounded to bf16 (any weight format).
- ``a8w4``: activations as fp8 e4m3, one fp32 scale per token per 128 values (DeepGEMM's and
  AITER's per-token-group quantization); mxfp4 weights (the ROCm FP8-requant path's default).
- ``a4w4``: activations as mxfp4 (FLOOR scale rule, one e8m0 scale per 32); mxfp4 weights.
- ``a8w8``: activations as fp8 e4m3, one scale per token per 128 values (``hwrun.formats``'
  ``quantize_fp8_groups``, as ``dense.linear_a8w8`` quantizes), over block-FP8 weights:
  DeepSeek-V3's FP8 inference, which quantizes every FP8 linear's input. The scales are fp32,
  or powers of two (ue8m0) when the routed weights are ``fp8_block128_ue8m0``.

Shared experts take bf16 activations, except under ``a8w8``: the MXFP4 checkpoints keep them out
of the routed experts' quantization (ML4's keeps them in their original precision), while
DeepSeek's FP8 checkpoints store them in block-FP8 like the routed ones and its inference code
quantizes their inputs as it does every FP8 linear's; under ``a8w8`` they must be block-FP8 too.

``quantized`` (optional, ``a8w8`` only): ``x``'s codes ``[T, D]`` uint8 and scales ``[T, D / 128]``
fp32 exactly as ``quantize_fp8_groups(x, 128, ue8m0)`` gives them, made beforehand (the engine's
norm kernel writes them beside its output), as ``dense.linear_a8w8`` takes them: an impl may
read them instead of quantizing ``x`` again, for the routed and the shared experts alike. They
are the caller's promise; the result is still defined by ``x`` (the reference quantizes ``x`` and
reads only their shapes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hwrun.formats.fp8 import dequantize_fp8_groups, quantize_fp8_groups
from hwrun.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from hwrun.ops.linear import quantized_input_problems
from hwrun.ops.quantized_weight import QuantizedWeight

# Mode -> (weight formats it runs on, multiple the GEMM input widths D and I must be).
ACTIVATION_MODES: dict[str, tuple[tuple[str, ...] | None, int]] = {
    "bf16": (None, 1),  # None: every weight format
    "a8w4": (("mxfp4",), 128),
    "a4w4": (("mxfp4",), 32),
    "a8w8": (("fp8_block128", "fp8_block128_ue8m0"), 128),
}


def quantize_activation(
    a: torch.Tensor, mode: str, ue8m0: bool = False
) -> torch.Tensor:  # [T, N] -> [T, N] fp32
    """``a`` rounded to the activation format of ``mode`` and decoded back to fp32 (``ue8m0``:
    a8w8's scales as powers of two)."""
    if mode == "bf16":
        return a.to(torch.bfloat16).float()
    if a.shape[0] == 0:
        return a.float()
    if mode in ("a8w4", "a8w8"):
        groups = quantize_fp8_groups(a.float(), group=128, ue8m0=ue8m0 and mode == "a8w8")
        return dequantize_fp8_groups(*groups)
    return dequantize_mxfp4(*quantize_mxfp4(a.float()))


def _swiglu(
    a: torch.Tensor,  # [n, D] fp32, already in the activation format
    w13: torch.Tensor,  # [2I, D] fp32
    w2: QuantizedWeight,  # [D, I]
    mode: str,
    ue8m0: bool = False,
) -> torch.Tensor:  # [n, D] fp32
    """One token at a time (matrix-vector products): CPU BLAS rounds a matrix product
    differently with its row count, and a token must get the same bits in any batch."""
    w2_dense = w2.dequantize()
    out = torch.empty(a.shape[0], w2_dense.shape[0], dtype=torch.float32, device=a.device)
    for row in range(a.shape[0]):
        gate, up = (w13 @ a[row]).chunk(2)
        hidden = quantize_activation((F.silu(gate) * up).unsqueeze(0), mode, ue8m0)[0]
        out[row] = w2_dense @ hidden
    return out


def experts(
    x: torch.Tensor,  # [T, D] bfloat16 (any float dtype; the output has the same)
    w13: QuantizedWeight,  # [E, 2I, D], rows [0, I) gate, [I, 2I) up
    w2: QuantizedWeight,  # [E, D, I]
    ids: torch.Tensor,  # [T, k] int32/int64 expert ids; -1 = slot not served here (EP)
    weights: torch.Tensor,  # [T, k] float32
    activation_mode: str = "bf16",
    shared_experts: tuple[QuantizedWeight, QuantizedWeight] | None = None,  # [2Is, D], [D, Is]
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # a8w8: x's codes and scales
) -> torch.Tensor:  # [T, D] x.dtype
    """Routed experts weighted by ``weights``, plus the shared experts (see the module doc).

    Only the experts some token chose are decoded, one at a time. An id of -1 contributes
    nothing (a slot whose expert lives on another rank under expert parallelism).

    :raises ValueError: a shape that disagrees with ``w13``/``w2``, an id out of range, an
        unknown activation mode or one the weight format cannot run, naming what was expected.
    """
    _check_experts_args(x, w13, w2, ids, weights, activation_mode, shared_experts, quantized)
    num_tokens, hidden = x.shape
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=x.device)
    ue8m0 = w13.format == "fp8_block128_ue8m0"
    routed_input = quantize_activation(x, activation_mode, ue8m0)
    ids = ids.long()
    for expert in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == expert, as_tuple=True)
        w13_e = w13.expert(expert).dequantize()
        y = _swiglu(routed_input[rows], w13_e, w2.expert(expert), activation_mode, ue8m0)
        out.index_add_(0, rows, y * weights[rows, slots].float().unsqueeze(-1))
    if shared_experts is not None:
        shared_w13, shared_w2 = shared_experts
        mode = activation_mode if activation_mode == "a8w8" else "bf16"
        shared_input = quantize_activation(x, mode, ue8m0)
        out += _swiglu(shared_input, shared_w13.dequantize(), shared_w2, mode, ue8m0)
    return out.to(x.dtype)


def quantized_problems(
    x: torch.Tensor, mode: str, quantized: tuple[torch.Tensor, torch.Tensor] | None
) -> list[str]:
    """Why ``quantized`` cannot be x's codes and scales for ``mode`` (none when it is None):
    an a8w8 input, of x's shape (``dense.linear_a8w8``'s rule)."""
    problems = quantized_input_problems(x, quantized)
    if quantized is not None and mode != "a8w8":
        problems.append(
            f"quantized (x's e4m3 codes and scales) is an a8w8 input; activation_mode is {mode!r}"
        )
    return problems


def _check_experts_args(
    x: torch.Tensor,
    w13: QuantizedWeight,
    w2: QuantizedWeight,
    ids: torch.Tensor,
    weights: torch.Tensor,
    mode: str,
    shared: tuple[QuantizedWeight, QuantizedWeight] | None,
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Every reason the call cannot run, raised at once."""
    labelled = {"w13": w13, "w2": w2}
    if shared is not None:
        if not isinstance(shared, tuple | list) or len(shared) != 2:
            raise ValueError(
                "moe.experts: shared_experts must be a pair (w13 [2Is, D], w2 [D, Is]) of "
                f"QuantizedWeight, got {type(shared).__name__}"
            )
        labelled.update({"shared w13": shared[0], "shared w2": shared[1]})
    for label, weight in labelled.items():
        if not isinstance(weight, QuantizedWeight):
            raise ValueError(
                f"moe.experts: {label} must be a QuantizedWeight, got {type(weight).__name__}; "
                "wrap a plain tensor with quantize_weight(w, 'bf16')"
            )
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(
            f"moe.experts: x must be a float tensor [T, D], got {x.dtype} {list(x.shape)}"
        )
    num_tokens, hidden = x.shape
    problems = []
    if len(w13.shape) != 3 or w13.shape[1] % 2 or w13.shape[2] != hidden:
        problems.append(
            f"w13 ({w13.name}) must be [E, 2I, D] with D = {hidden}, got {list(w13.shape)}"
        )
        num_experts, inter = None, None
    else:
        num_experts, inter = w13.shape[0], w13.shape[1] // 2
        if w2.shape != (num_experts, hidden, inter):
            problems.append(
                f"w2 ({w2.name}) must be [E, D, I] = {[num_experts, hidden, inter]} to match "
                f"w13 {list(w13.shape)} and x {list(x.shape)}, got {list(w2.shape)}"
            )
    problems += quantized_problems(x, mode, quantized)
    if ids.dim() != 2 or ids.shape[0] != num_tokens or ids.is_floating_point():
        problems.append(
            f"ids must be an integer tensor [T, k] with T = {num_tokens}, got "
            f"{ids.dtype} {list(ids.shape)}"
        )
    elif weights.shape != ids.shape or not weights.is_floating_point():
        problems.append(
            f"weights must be a float tensor [T, k] = {list(ids.shape)} like ids, "
            f"got {weights.dtype} {list(weights.shape)}"
        )
    elif num_experts is not None and ids.numel() and (ids.min() < -1 or ids.max() >= num_experts):
        problems.append(
            f"ids must be in -1..E-1 = -1..{num_experts - 1}, got values from "
            f"{int(ids.min())} to {int(ids.max())}"
        )
    if mode not in ACTIVATION_MODES:
        problems.append(f"activation_mode must be one of {list(ACTIVATION_MODES)}, got {mode!r}")
    else:
        formats, multiple = ACTIVATION_MODES[mode]
        quantized_inputs = (w13, w2, *(shared if mode == "a8w8" and shared is not None else ()))
        for weight in quantized_inputs:
            if formats is not None and weight.format not in formats:
                fix = "requantize it (moe.requant)"
                if mode == "a8w8":
                    fix = "quantize it to block-FP8"
                problems.append(
                    f"activation_mode {mode!r} runs on {'/'.join(formats)} weights, but "
                    f"{weight.name} is {weight.format}; {fix} or use 'bf16'"
                )
        if inter is not None and (hidden % multiple or inter % multiple):
            problems.append(
                f"activation_mode {mode!r} quantizes groups of {multiple}: D = "
                f"{hidden} and I = {inter} must be multiples of {multiple}"
            )
        shared_inter = shared[1].shape[-1] if mode == "a8w8" and shared is not None else 0
        if shared_inter % multiple:
            problems.append(
                f"activation_mode {mode!r} quantizes the shared experts' inputs too: their "
                f"width {shared_inter} must be a multiple of {multiple}"
            )
    if shared is not None:
        shared_w13, shared_w2 = shared
        ok = len(shared_w13.shape) == 2 and shared_w13.shape[0] % 2 == 0
        ok = ok and shared_w13.shape[1] == hidden
        if not ok or shared_w2.shape != (hidden, shared_w13.shape[0] // 2):
            problems.append(
                f"shared_experts must be (w13 [2Is, D], w2 [D, Is]) with D = {hidden}, got "
                f"{list(shared_w13.shape)} ({shared_w13.name}) and {list(shared_w2.shape)} "
                f"({shared_w2.name})"
            )
    if problems:
        raise ValueError("moe.experts: " + "; ".join(problems))
