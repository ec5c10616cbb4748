"""The engine's flags, shared by the commands that start an engine (`hwrun generate`, and any
other command that runs the built-in engine): one click decorator and the EngineConfig they make.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from hwrun.engine.config import (
    EXPERT_ACTIVATION_DTYPES,
    INDEX_DTYPES,
    INDEX_QUERY_DTYPES,
    LATENT_DTYPES,
    LINEAR_ACTIVATION_DTYPES,
)

ENGINE_FLAGS = (
    "model",
    "platform",
    "device",
    "kv_cache_dtype",
    "index_dtype",
    "index_query_dtype",
    "linear_activation_dtype",
    "expert_activation_dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_kv_tokens",
    "kv_cache_memory",
    "enable_prefix_caching",
    "batch_invariant",
    "no_fallback",
    "no_cuda_graphs",
    "async_scheduling",
    "cpu_threads",
    "tensor_parallel",
    "decode_context_parallel",
)


def engine_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the engine's flags to a click command; :func:`engine_config` turns them into an
    EngineConfig."""
    flags = [
        click.option(
            "--model",
            type=click.Path(exists=True, file_okay=False),
            default=None,
            help="Checkpoint directory (config.json + safetensors). Default: the embedded model.",
        ),
        click.option(
            "--platform", default=None, help="Platform name or 'auto' (default: HWRUN_PLATFORM)."
        ),
        click.option("--device", default=None, help="Torch device (default: the platform's)."),
        click.option(
            "--kv-cache-dtype",
            type=click.Choice(LATENT_DTYPES),
            default="bf16",
            show_default=True,
            help="Latent format of the KV cache.",
        ),
        click.option(
            "--index-dtype",
            type=click.Choice(INDEX_DTYPES),
            default="bf16",
            show_default=True,
            help="Format of the indexer's cached keys.",
        ),
        click.option(
            "--index-query-dtype",
            type=click.Choice(INDEX_QUERY_DTYPES),
            default="bf16",
            show_default=True,
            help="The indexer's queries: bf16 (as transformers), or fp8 with a per-head scale "
            "(as DeepSeek's inference code; DeepGEMM's logits kernels need it).",
        ),
        click.option(
            "--linear-activation-dtype",
            type=click.Choice(LINEAR_ACTIVATION_DTYPES),
            default="bf16",
            show_default=True,
            help="Inputs of the block-FP8 linears: bf16 (as transformers), or fp8 per token and "
            "128 columns (as DeepSeek's inference code; e4m3 on both sides of the GEMM).",
        ),
        click.option(
            "--expert-activation-dtype",
            type=click.Choice(EXPERT_ACTIVATION_DTYPES),
            default="bf16",
            show_default=True,
            help="Inputs of the block-FP8 experts' GEMMs, shared experts included: bf16 (as "
            "transformers), or fp8 per token and 128 values (as DeepSeek's inference code; "
            "moe.experts' a8w8 mode).",
        ),
        click.option(
            "--max-model-len",
            type=int,
            default=None,
            help="Longest sequence (default: the checkpoint's).",
        ),
        click.option("--max-num-seqs", type=int, default=32, show_default=True),
        click.option(
            "--max-num-batched-tokens",
            type=int,
            default=2048,
            show_default=True,
            help="Token budget of one step (prefill chunks and decodes together).",
        ),
        click.option("--num-kv-tokens", type=int, default=None, help="KV pool size in tokens."),
        click.option("--kv-cache-memory", type=int, default=None, help="KV pool size in bytes."),
        click.option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            default=True,
            show_default=True,
            help="Share the KV of repeated prompt prefixes.",
        ),
        click.option(
            "--batch-invariant",
            is_flag=True,
            help="A request's logprobs do not depend on what it is batched with.",
        ),
        click.option(
            "--no-fallback", is_flag=True, help="Refuse to run an op on the reference fallback."
        ),
        click.option(
            "--tensor-parallel-size",
            "tensor_parallel",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Split the model across this many local processes (one GPU each; gloo on CPU).",
        ),
        click.option(
            "--decode-context-parallel-size",
            "decode_context_parallel",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Split the KV cache by token across this many local processes (weights "
            "replicated; one GPU each; gloo on CPU). Not with --tensor-parallel-size > 1 yet.",
        ),
        click.option(
            "--cpu-threads",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="torch threads while the model runs on a CPU (a step is many small ops).",
        ),
        click.option(
            "--no-cuda-graphs",
            is_flag=True,
            help="Run decode steps eagerly (by default they are captured on CUDA when every op "
            "serving them is graph-safe).",
        ),
        click.option(
            "--async-scheduling",
            is_flag=True,
            help="Launch each decode step before the previous one's tokens reach the "
            "host, so scheduling, sampling and outputs overlap the device (one process only).",
        ),
    ]
    for flag in reversed(flags):
        command = flag(command)
    return command


def engine_config(options: dict[str, Any]):
    """The EngineConfig of the engine flags in ``options`` (a command's keyword arguments)."""
    from hwrun import knobs
    from hwrun.engine.config import EngineConfig

    negated = ("no_fallback", "no_cuda_graphs")
    values = {name: options[name] for name in ENGINE_FLAGS if name not in negated}
    values["platform"] = values["platform"] or knobs.default_platform()
    return EngineConfig(
        allow_fallback=not options["no_fallback"],
        cuda_graphs=not options["no_cuda_graphs"],
        **values,
    )
