"""vLLM on AMD Instinct GPUs (``hwrun serve --engine vllm --platform amd``), and its rules.

Recipes from the vLLM day-0 posts: AITER on (``VLLM_ROCM_USE_AITER=1``) everywhere. Kimi K3.1 Pro:
fast GPU safetensors loading, 16 sequences at 0.85 GPU memory, the DSpark preview speculator.
Mistral Large 4: FP8 experts re-quantized to MXFP4 at load (``VLLM_FP8_MOE_REQUANT=mxfp4``, FP8
activations ``a8w4``), AITER's Triton sparse MLA and its custom all-reduce up to 128 MiB, the
DSpark drafter and the mistral parsers; with ``--decode-backend latency_specialized`` the TP4
recipe: the fused FlyDSL decode, MXFP4 activations (``a4w4``), 64 sequences.

The latency_specialized decode refuses to start (every reason at once, as vLLM does) unless it
runs at TP4 with a4w4 experts on the FP8 latent cache, without expert or context parallelism,
LoRA, KV connectors or a speculative method other than DSpark. MXFP4 experts need gfx950
(MI350 series): gfx942 has no FP4 math.
"""

from __future__ import annotations

import json

from hwrun.deployment import Deployment
from hwrun.hookspecs import hookimpl
from hwrun.serve.recipe import (
    KIMI_K31_PRO,
    MISTRAL_LARGE_4,
    ServeRecipe,
    data_parallel_flags,
    model_family,
    parallel_flags,
)
from hwrun.target import Target

NAME = "amd"
LATENCY_SPECIALIZED = "latency_specialized"
DECODE_BACKENDS = ("default", LATENCY_SPECIALIZED)
LATENCY_TP = 4
MXFP4_ARCHS = ("gfx950",)
AITER_ALL_REDUCE_MAX = 134217728  # 128 MiB: large prefill all-reduces stay on AITER's


@hookimpl
def hwrun_serve_recipe(deployment: Deployment) -> ServeRecipe:
    family = model_family(deployment.model)
    latency = deployment.decode_backend == LATENCY_SPECIALIZED
    env = [("VLLM_ROCM_USE_AITER", "1")]
    args = parallel_flags(deployment) + data_parallel_flags(deployment, "NODE_RANK", 29696)
    if latency:
        config = json.dumps({"decode_backend": LATENCY_SPECIALIZED})
        args += ["--additional-config", config, "--max-num-seqs", "64"]
    if family is KIMI_K31_PRO:
        env.append(("SAFETENSORS_FAST_GPU", "1"))
        args = ["--served-model-name", "kimi-k31-pro", *args, *family.loading]
        args += ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.85"]
        args += family.speculative_flags()
    elif family is MISTRAL_LARGE_4:
        env += [
            ("VLLM_FP8_MOE_REQUANT", "mxfp4"),
            ("VLLM_FP8_MOE_REQUANT_ACT", "a4w4" if latency else "a8w4"),
            ("VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA", "1"),
            ("AITER_CUSTOM_AR_MAX_SIZE", str(AITER_ALL_REDUCE_MAX)),
        ]
        args += [*family.speculative_flags(), *family.parser_flags()]
    return ServeRecipe(args=tuple(args), env=tuple(env))


@hookimpl
def hwrun_validate_deployment(deployment: Deployment, target: Target) -> list[str]:
    reasons = []
    d = deployment
    if d.decode_backend not in DECODE_BACKENDS:
        reasons.append(
            f"amd: decode backend {d.decode_backend!r} does not exist; choose one of "
            f"{', '.join(DECODE_BACKENDS)}"
        )
    if d.moe_requant not in (None, "mxfp4"):
        reasons.append(f"amd: VLLM_FP8_MOE_REQUANT={d.moe_requant} is unknown; use mxfp4")
    if d.moe_activation is not None and d.moe_activation not in ("a8w4", "a4w4"):
        reasons.append(
            f"amd: VLLM_FP8_MOE_REQUANT_ACT={d.moe_activation} is unknown; use a8w4 or a4w4"
        )
    if d.decode_backend == LATENCY_SPECIALIZED:
        reasons += _latency_specialized_reasons(d)
    if d.check_devices and (d.moe_requant or d.weight_format == "mxfp4"):
        other = [dev for dev in target.devices if dev.arch not in MXFP4_ARCHS]
        if other:
            reasons.append(
                f"amd: MXFP4 experts need {' or '.join(MXFP4_ARCHS)} (MI350 series); "
                f"{other[0].name} is {other[0].arch}, which has no FP4 math: serve the FP8 "
                "experts (unset VLLM_FP8_MOE_REQUANT) on this GPU"
            )
    return reasons


def _latency_specialized_reasons(d: Deployment) -> list[str]:
    """vLLM's latency_specialized decode refuses everything its fused kernel does not run."""
    why = "amd: the latency_specialized decode"
    reasons = []
    if d.tensor_parallel != LATENCY_TP:
        reasons.append(f"{why} runs at tensor parallel 4 only, not {d.tensor_parallel}; use --tp 4")
    if d.moe_activation != "a4w4":
        reasons.append(
            f"{why} needs experts stored as a4w4 (VLLM_FP8_MOE_REQUANT=mxfp4 with "
            f"VLLM_FP8_MOE_REQUANT_ACT=a4w4), got {d.moe_activation or 'the checkpoint experts'}"
        )
    if d.expert_parallel:
        reasons.append(f"{why} does not support expert parallelism; drop --enable-expert-parallel")
    if d.decode_context_parallel > 1 or d.prefill_context_parallel > 1:
        reasons.append(
            f"{why} does not support context parallelism (DCP {d.decode_context_parallel}, "
            f"PCP {d.prefill_context_parallel}); drop --dcp / --prefill-context-parallel-size"
        )
    if d.data_parallel > 1:
        reasons.append(f"{why} serves one replica of TP4; run one server per replica, not --dp")
    if d.lora:
        reasons.append(f"{why} does not support LoRA; drop --enable-lora")
    if d.kv_connector:
        reasons.append(
            f"{why} does not support KV connectors ({d.kv_connector}); drop --kv-transfer-config"
        )
    if d.speculative_method not in (None, "dspark"):
        reasons.append(
            f"{why} supports DSpark speculation only, not {d.speculative_method!r}; use the "
            "recipe's --speculative-config"
        )
    if d.latent_format not in ("fp8_ds_mla", "fp8_e4m3"):
        reasons.append(
            f"{why} runs on the default FP8 latent cache, not {d.latent_format}; drop "
            "--kv-cache-dtype"
        )
    return reasons
