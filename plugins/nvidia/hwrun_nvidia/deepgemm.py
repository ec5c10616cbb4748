"""DeepGEMM adapters: the indexer logits (``fp8_paged_mqa_logits``, ``fp8_mqa_logits``) and the
a8w8 dense linear (``fp8_gemm_nt``).

Registered only when ``deep_gemm`` can be found; the import itself (which JIT-compiles on first
call with the machine's nvcc) happens at the first call. Conventions converted to the contract:
- DeepGEMM takes fp8 queries only (``float8_e4m3fn`` codes, their scale folded into the
  weights: ``hwrun.ops.indexer.fold_q_scale``), 32 or 64 heads, head dim 128, fp8 keys, and
  64-token pages on Hopper.
- its logits rows may be wider than asked (a padded row stride), and positions at and past a
  row's length are left unwritten: the adapter slices to ``max_ctx`` / ``N`` and writes -inf
  there itself (paged: in place, only past each row's length, one small Triton launch: a mask
  over the whole [B, max_ctx] cost ~80 us per layer at 64 x 128K on the H200, more than a
  quarter of the logits kernel).
- ``fp8_gemm_nt`` takes the activations already quantized (e4m3 codes with one fp32 scale per
  token and 128 columns, the layout ``dense.linear_a8w8`` defines): the Triton tier's quantizer
  (``hwrun.kernels.triton.activation_quant``, byte-exact to hwrun.formats) makes them, then
  DeepGEMM multiplies them by the weight's e4m3 codes with its fp32 128x128 tile scales. ue8m0
  weight scales are not served here (SM90 DeepGEMM takes fp32 scales; the Triton tier serves them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwrun.ops.linear import check_linear_args
from hwrun.ops.quantized_weight import QuantizedWeight
from hwrun.registry import OpImpl, OpRegistry, OpSpec, dtype_reasons, format_reasons
from hwrun_nvidia.device_checks import cuda_reasons, importable

DEEPGEMM_HEADS = (32, 64)


def _validate(spec: OpSpec, paged: bool) -> list[str]:
    reasons = []
    if not importable("deep_gemm"):
        reasons.append("DeepGEMM is not installed (pip install tokenspeed-deepgemm)")
    reasons += cuda_reasons(spec, min_sm=90)
    reasons += format_reasons(spec, ("fp8",), "index-key")
    reasons += dtype_reasons(spec, ("float8_e4m3fn",), "query")
    if spec.num_heads is not None and spec.num_heads not in DEEPGEMM_HEADS:
        reasons.append(f"DeepGEMM needs {DEEPGEMM_HEADS} index heads, got {spec.num_heads}")
    if spec.head_dim not in (None, 128):
        reasons.append(f"DeepGEMM needs head_dim 128, got {spec.head_dim}")
    if paged and spec.block_size not in (None, 64):
        reasons.append(f"DeepGEMM's paged logits need 64-token blocks, got {spec.block_size}")
    return reasons


@triton.jit
def _fill_past_lengths(logits_ptr, lens_ptr, stride_row, width, BLOCK: tl.constexpr):
    """-inf at and past row r's length; blocks wholly before it exit at once."""
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    length = tl.load(lens_ptr + row)
    if start + BLOCK > length:
        cols = start + tl.arange(0, BLOCK)
        past = (cols >= length) & (cols < width)
        tl.store(logits_ptr + row.to(tl.int64) * stride_row + cols, float("-inf"), mask=past)


def logits_paged(
    q: torch.Tensor,  # [B, n, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [B * n, H] float32
    cache: torch.Tensor,  # [num_blocks, block_size * 132] uint8, contiguous pages
    fmt: str,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, n] int32
    max_ctx: int,
) -> torch.Tensor:  # [B * n, max_ctx] float32, -inf at and past each row's length
    import deep_gemm

    if fmt != "fp8" or q.dtype != torch.float8_e4m3fn:
        raise ValueError(
            f"DeepGEMM paged logits take fp8 keys and fp8 queries, got {fmt} {q.dtype}"
        )
    num_blocks = cache.shape[0]
    block_size = cache.shape[1] // 132
    fused = cache.as_strided((num_blocks, block_size, 1, 132), (cache.stride(0), 132, 132, 1))
    lens = context_lens.to(torch.int32).contiguous()
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, block_size, sms)
    logits = deep_gemm.fp8_paged_mqa_logits(
        q.contiguous(),
        fused,
        weights.float().contiguous(),
        lens,
        block_table.to(torch.int32).contiguous(),
        meta,
        max_ctx,
        False,
    )
    logits = logits[:, :max_ctx]
    rows, block = logits.shape[0], 1024
    _fill_past_lengths[(rows, triton.cdiv(max_ctx, block))](
        logits, lens.reshape(-1), logits.stride(0), max_ctx, BLOCK=block
    )
    return logits


def logits_ragged(
    q: torch.Tensor,  # [M, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [M, H] float32
    key_elements: torch.Tensor,  # [N, 128] uint8 e4m3
    key_scales: torch.Tensor,  # [N, 4] uint8, one fp32 each
    fmt: str,
    ks: torch.Tensor,  # [M] int32
    ke: torch.Tensor,  # [M] int32
) -> torch.Tensor:  # [M, N] float32, -inf outside [ks, ke)
    import deep_gemm

    if fmt != "fp8" or q.dtype != torch.float8_e4m3fn:
        raise ValueError(f"DeepGEMM logits take fp8 keys and fp8 queries, got {fmt} {q.dtype}")
    n = key_elements.shape[0]
    keys = key_elements.contiguous().view(torch.float8_e4m3fn)
    scales = key_scales.contiguous().view(torch.float32).reshape(n)
    starts, ends = ks.to(torch.int32).contiguous(), ke.to(torch.int32).contiguous()
    logits = deep_gemm.fp8_mqa_logits(
        q.contiguous(), (keys, scales), weights.float().contiguous(), starts, ends
    )
    pos = torch.arange(n, device=q.device)
    outside = (pos[None, :] < starts[:, None]) | (pos[None, :] >= ends[:, None])
    return logits[:, :n].masked_fill(outside, float("-inf"))


def _linear_validate(spec: OpSpec) -> list[str]:
    reasons = []
    if not importable("deep_gemm"):
        reasons.append("DeepGEMM is not installed (pip install tokenspeed-deepgemm)")
    reasons += cuda_reasons(spec, min_sm=90)
    reasons += format_reasons(spec, ("fp8_block128",), "weight")
    return reasons + dtype_reasons(spec, ("bfloat16",), "input")


def linear_a8w8(
    x: torch.Tensor,  # [T, C] bfloat16, C a multiple of 128
    weight: QuantizedWeight,  # [R, C] fp8_block128
) -> torch.Tensor:  # [T, R] bfloat16
    import deep_gemm

    from hwrun.kernels.triton.activation_quant import quantize_activations

    check_linear_args(x, weight, op="dense.linear_a8w8", formats=("fp8_block128",))
    if x.dtype != torch.bfloat16:
        raise ValueError(f"DeepGEMM's fp8_gemm_nt writes bf16: x must be bf16, got {x.dtype}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    codes, scales = quantize_activations(x, ue8m0=False)
    w_codes = weight.data.contiguous().view(torch.float8_e4m3fn)
    deep_gemm.fp8_gemm_nt(
        (codes.view(torch.float8_e4m3fn), scales), (w_codes, weight.scales.contiguous()), out
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
            # No host read: the quantizer and the GEMM are device launches (checked by
            # test_adapters_gpu.py, capture then replay against eager).
            graph_safe=True,
            validate=_linear_validate,
            priority=20,
            description="Triton activation quantizer + DeepGEMM fp8_gemm_nt (1x128 / 128x128)",
        )
    )
    for op, fn, paged in (
        ("indexer.logits_paged", logits_paged, True),
        ("indexer.logits_ragged", logits_ragged, False),
    ):
        registry.register(
            OpImpl(
                op=op,
                name="deepgemm",
                platform=registry.platform,
                fn=fn,
                # Paged: metadata from a device kernel, no host read, so decode graphs
                # capture it (test_adapters_gpu.py checks replay against eager).
                graph_safe=paged,
                validate=lambda spec, paged=paged: _validate(spec, paged),
                priority=20,
                description="DeepGEMM fp8 MQA logits (fp8 q and keys, 32 or 64 heads)",
            )
        )
