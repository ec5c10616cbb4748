"""DeepGEMM adapters for the indexer logits (``fp8_paged_mqa_logits``, ``fp8_mqa_logits``).

Registered only when ``deep_gemm`` can be found; the import itself (which JIT-compiles on first
call with the machine's nvcc) happens at the first call. Conventions converted to the contract:
- DeepGEMM takes fp8 queries only (``float8_e4m3fn`` codes, their scale folded into the
  weights: ``hwrun.ops.indexer.fold_q_scale``), 32 or 64 heads, head dim 128, fp8 keys, and
  64-token pages on Hopper.
- its logits rows may be wider than asked (a padded row stride), and positions at and past a
  row's length are left unwritten: the adapter slices to ``max_ctx`` / ``N`` and writes -inf
  outside each row's window itself, in place, in one small Triton launch that writes only
  those columns (``hwrun.kernels.triton.window_fill``). A torch mask over every column cost
  ~80 us per layer at 64 x 128K decode and ~4.5 ms per layer in a 32K-context prefill chunk
  of 8192 tokens on the H200.
- the paged logits' tile schedule (``get_paged_mqa_logits_metadata``) depends only on the
  context lengths: the last one is reused while the same lengths come back (``schedule``), so
  an engine step computes it once, not once per layer.
"""

from __future__ import annotations

import torch

from hwrun.kernels.triton.window_fill import fill_outside_windows
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
    meta = schedule(deep_gemm, lens, block_size, sms)
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
    # ~80 us per layer at 64 x 128K as a full-width torch mask; writes only the tails here
    return fill_outside_windows(logits[:, :max_ctx], None, lens.reshape(-1))


# The last schedule computed, with what it was computed from (see schedule()).
_last_schedule: tuple | None = None


def schedule(deep_gemm, lens: torch.Tensor, block_size: int, sms: int) -> torch.Tensor:
    """DeepGEMM's tile schedule for these context lengths: computed, or the last call's when
    it was made from the same lengths. An engine step hands every layer the same lengths (a
    view of one tensor), and computing the schedule per layer was 16 launches of 3.8 us a step
    on the H200.

    "The same" is checked without reading the device: the same storage, shape and strides at
    the same version (every in-place write bumps it), while the last lengths tensor is held
    here (so its memory cannot be handed to another tensor), and either both calls or neither
    inside a CUDA graph capture (a schedule made outside a capture is not computed by the
    graph's replays). Inference tensors keep no version: their schedule is always computed."""
    global _last_schedule
    try:
        version = lens._version
    except RuntimeError:  # an inference tensor
        return deep_gemm.get_paged_mqa_logits_metadata(lens, block_size, sms)
    capturing = lens.is_cuda and torch.cuda.is_current_stream_capturing()
    key = (lens.data_ptr(), lens.shape, lens.stride(), version, block_size, sms, capturing)
    if _last_schedule is not None and _last_schedule[1] == key:
        return _last_schedule[2]
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, block_size, sms)
    _last_schedule = (lens, key, meta)
    return meta


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
    return fill_outside_windows(logits[:, :n], starts, ends)


def register(registry: OpRegistry) -> None:
    if not importable("deep_gemm"):
        return
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
