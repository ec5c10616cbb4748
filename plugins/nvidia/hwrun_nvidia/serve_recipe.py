"""vLLM on NVIDIA GPUs (``hwrun serve --engine vllm --platform nvidia``), and its rules.

The recipe is the vLLM day-0 quick start: TP8 (``--tp``), the model family's flags (for Kimi
K3.1 Pro remote code, fastsafetensors loading, the kimi_k3 parsers and the DSpark preview
speculator; for Mistral Large 4 the DSpark drafter and the mistral parsers), DCP when asked.
Rules: Mistral Large 4's DCP needs the default FP8 latent cache; NVFP4 checkpoints need
Blackwell (sm_100+) for their FP4 tensor-core math; no special decode backend exists here.
"""

from __future__ import annotations

from hwrun.deployment import Deployment
from hwrun.hookspecs import hookimpl
from hwrun.serve.recipe import (
    KIMI_K31_PRO,
    MISTRAL_LARGE_4,
    ServeRecipe,
    data_parallel_flags,
    model_family,
    parallel_flags,
    standard_decode_only,
)
from hwrun.target import Target

NAME = "nvidia"
BLACKWELL_SM = 100


@hookimpl
def hwrun_serve_recipe(deployment: Deployment) -> ServeRecipe:
    family = model_family(deployment.model)
    args = parallel_flags(deployment) + data_parallel_flags(deployment, "NODE_RANK", 29696)
    if family is KIMI_K31_PRO:
        args += [*family.loading, *family.parser_flags(), *family.speculative_flags()]
    elif family is MISTRAL_LARGE_4:
        args += [*family.speculative_flags(), *family.parser_flags()]
    return ServeRecipe(args=tuple(args))


@hookimpl
def hwrun_validate_deployment(deployment: Deployment, target: Target) -> list[str]:
    reasons = standard_decode_only(deployment, NAME)
    family = model_family(deployment.model)
    if (
        family is MISTRAL_LARGE_4
        and deployment.decode_context_parallel > 1
        and deployment.latent_format != "fp8_ds_mla"
    ):
        reasons.append(
            f"nvidia: Mistral Large 4 under decode context parallel "
            f"{deployment.decode_context_parallel} needs the default FP8 latent cache "
            f"(fp8_ds_mla), not {deployment.latent_format}; drop --kv-cache-dtype or --dcp"
        )
    if deployment.check_devices and "nvfp4" in deployment.model.lower():
        old = [d for d in target.devices if _sm(d.arch) < BLACKWELL_SM]
        if old:
            reasons.append(
                f"nvidia: {deployment.model} is an NVFP4 checkpoint and needs Blackwell "
                f"(sm_100+) for FP4 math; {old[0].name} is {old[0].arch}: serve the FP8 "
                "checkpoint on this GPU"
            )
    return reasons


def _sm(arch: str | None) -> int:
    digits = (arch or "sm_0")[3:].rstrip("af")
    return int(digits) if digits.isdigit() else 0
