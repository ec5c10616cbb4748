"""vLLM on Google TPUs through vllm-torchtpu (``hwrun serve --engine vllm --platform tpu``).

The validated layout (the vLLM day-0 posts, a 16-chip TPU v7x slice): tensor parallel within a
host, data-parallel ranks across hosts (each host starts its ranks, from ``$TPU_WORKER_ID``,
with the head at ``$HEAD_IP``), expert parallel for the MoE with the expert-weight filter, DCP
for long contexts. Mistral Large 4 runs bf16 activations over an FP8 (E4M3) latent cache:
``--tp 8 --dp 4 --nodes 4 --ep`` reproduces the post's command.
"""

from __future__ import annotations

from hwrun.deployment import Deployment
from hwrun.hookspecs import hookimpl
from hwrun.serve.recipe import (
    MISTRAL_LARGE_4,
    ServeRecipe,
    data_parallel_flags,
    model_family,
    standard_decode_only,
)
from hwrun.target import Target

NAME = "tpu"


@hookimpl
def hwrun_serve_recipe(deployment: Deployment) -> ServeRecipe:
    args = ["--tensor-parallel-size", str(deployment.tensor_parallel)]
    args += data_parallel_flags(deployment, "TPU_WORKER_ID", 29696)
    if deployment.expert_parallel:
        args += ["--enable-expert-parallel", "--enable-ep-weight-filter"]
    if deployment.decode_context_parallel > 1:
        args += ["--decode-context-parallel-size", str(deployment.decode_context_parallel)]
    if model_family(deployment.model) is MISTRAL_LARGE_4:
        args += ["--dtype", "bfloat16", "--kv-cache-dtype", "fp8_e4m3"]
    notes = ()
    if deployment.nodes > 1:
        notes = (
            "run the same command on every host of the slice, with HEAD_IP (the first host's "
            "address) and TPU_WORKER_ID (the host's index) set",
        )
    return ServeRecipe(args=tuple(args), distribution="vllm-torchtpu", notes=notes)


@hookimpl
def hwrun_validate_deployment(deployment: Deployment, target: Target) -> list[str]:
    return standard_decode_only(deployment, NAME)
