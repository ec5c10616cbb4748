"""What the user asked the engine for, checked once: model, platform, formats, pool, batching."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LATENT_DTYPES = ("bf16", "fp8_ds_mla", "nvfp4_ds_mla")
INDEX_DTYPES = ("bf16", "fp8", "mxfp4")
INDEX_QUERY_DTYPES = ("bf16", "fp8")
LINEAR_ACTIVATION_DTYPES = ("bf16", "fp8")
EXPERT_ACTIVATION_DTYPES = ("bf16", "fp8")


def default_model_dir() -> Path:
    """The small model shipped inside hwrun (used when no ``--model`` is given)."""
    return Path(__file__).resolve().parent.parent / "default_model"


@dataclass(frozen=True)
class EngineConfig:
    """Engine options (the flags of ``hwrun generate`` / ``hwrun serve``).

    The KV pool is sized by ``num_kv_tokens`` when given, else by ``kv_cache_memory`` bytes,
    else to hold ``max_num_seqs`` sequences of ``max_model_len`` tokens.
    """

    model: str | None = None  # checkpoint directory; None: the embedded default model
    platform: str = "auto"
    device: str | None = None  # torch device; None: the Target's
    kv_cache_dtype: str = "bf16"  # latent format
    index_dtype: str = "bf16"  # index-key format
    # The indexer's queries: "bf16" as transformers computes them, or "fp8" (e4m3, one scale
    # per token and head folded into the head weights) as DeepSeek's inference code does, which
    # DeepGEMM's logits kernels need.
    index_query_dtype: str = "bf16"
    # The block-FP8 linears' inputs: "bf16" as transformers multiplies them, or "fp8" (e4m3, one
    # scale per token and 128 columns) as DeepSeek's inference code does (dense.linear_a8w8).
    linear_activation_dtype: str = "bf16"
    # The routed and shared experts' GEMM inputs: "bf16" as transformers multiplies them, or
    # "fp8" (moe.experts' a8w8 mode: e4m3 per token and 128 values) as DeepSeek's inference code
    # quantizes every FP8 linear's input. Block-FP8 experts only.
    expert_activation_dtype: str = "bf16"
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    num_kv_tokens: int | None = None
    kv_cache_memory: int | None = None  # bytes
    enable_prefix_caching: bool = True
    batch_invariant: bool = False
    cuda_graphs: bool = True  # capture decode steps per batch bucket (CUDA, graph-safe ops only)
    # Launch the next decode step before the current one's tokens reach the host (decode
    # steps, one process): the host's scheduling, sampling and outputs overlap the device's work.
    async_scheduling: bool = False
    # torch intra-op threads while the model runs on a CPU. One by default: a step is hundreds of
    # small per-row ops, where more threads only add synchronisation (a loaded 2-core machine ran
    # the default model 10x slower with 2 threads than with 1).
    cpu_threads: int = 1
    tensor_parallel: int = 1  # ranks (local processes) the model is split across
    # ranks (local processes) the KV cache is split across by token; weights replicated
    decode_context_parallel: int = 1
    allow_fallback: bool = True  # an op the platform cannot serve may run on the reference
    seed: int = 0

    @property
    def model_dir(self) -> Path:
        return Path(self.model) if self.model else default_model_dir()

    def problems(self) -> list[str]:
        """Every reason these options cannot run, each saying what to change."""
        reasons = []
        for flag, value, choices, what in (
            ("--kv-cache-dtype", self.kv_cache_dtype, LATENT_DTYPES, "a latent format"),
            ("--index-dtype", self.index_dtype, INDEX_DTYPES, "an index-key format"),
            (
                "--index-query-dtype",
                self.index_query_dtype,
                INDEX_QUERY_DTYPES,
                "an indexer query dtype",
            ),
            (
                "--linear-activation-dtype",
                self.linear_activation_dtype,
                LINEAR_ACTIVATION_DTYPES,
                "a linear activation dtype",
            ),
            (
                "--expert-activation-dtype",
                self.expert_activation_dtype,
                EXPERT_ACTIVATION_DTYPES,
                "an expert activation dtype",
            ),
        ):
            if value not in choices:
                reasons.append(
                    f"{flag} {value!r} is not {what}; choose one of {', '.join(choices)}"
                )
        for name in ("max_num_seqs", "max_num_batched_tokens", "cpu_threads"):
            if getattr(self, name) < 1:
                reasons.append(f"--{name.replace('_', '-')} must be >= 1")
        tp, dcp = self.tensor_parallel, self.decode_context_parallel
        for flag, value in (
            ("--tensor-parallel-size", tp),
            ("--decode-context-parallel-size", dcp),
        ):
            if value < 1:
                reasons.append(f"{flag} must be >= 1, got {value}")
        if tp > 1 and dcp > 1:
            reasons.append(
                f"--tensor-parallel-size {tp} with --decode-context-parallel-size {dcp}: the "
                "built-in engine splits heads (TP) or the KV cache by token (DCP), not both at "
                "once yet; set one of them to 1 (hwrun serve --engine vllm runs vLLM's DCP, "
                "carved out of its TP group)"
            )
        if self.async_scheduling and (tp > 1 or dcp > 1):
            reasons.append(
                "--async-scheduling runs in one process for now: the process group's runner "
                "takes its token ids from the host; drop it or set --tensor-parallel-size and "
                "--decode-context-parallel-size to 1"
            )
        for name in ("max_model_len", "num_kv_tokens", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and value < 1:
                reasons.append(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if not self.model_dir.is_dir():
            reasons.append(f"model directory {self.model_dir} does not exist")
        return reasons
