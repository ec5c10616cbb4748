"""What a platform plugin returns from ``hwrun_serve_recipe``, and the facts its recipes share.

A :class:`ServeRecipe` is the part of a ``vllm serve`` command a platform decides: the flags after
the model and the environment. The model families' own flags (tool-call and reasoning parsers,
the DSpark speculative config, remote code and the loader) are the same on every platform that
uses them, so they live here once, as the seeds' day-0 commands give them:

- Kimi K3.1 Pro (vLLM day-0 post, NVIDIA and AMD quick starts): ``--trust-remote-code
  --load-format fastsafetensors``, the ``kimi_k3`` parsers with ``--enable-auto-tool-choice``,
  and the DSpark preview speculator with 5 tokens, probabilistic draft sampling.
- Mistral Large 4 (vLLM day-0 post): the ``mistral`` parsers with ``--enable-auto-tool-choice``,
  and the checkpoint's built-in DSpark drafter with 3 tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hwrun.deployment import Deployment


@dataclass(frozen=True)
class ServeRecipe:
    """``vllm serve MODEL *args`` with ``env`` set, on one platform.

    ``args`` may name per-node environment variables as ``$NAME`` (see the hook's rule);
    ``distribution`` is the package that provides ``vllm`` there (named when it is missing);
    ``notes`` are printed with ``--dry-run``.
    """

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    distribution: str = "vllm"
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelFamily:
    """A model family's own vLLM flags, by part, so a platform picks the parts its recipe uses."""

    name: str
    id_patterns: tuple[str, ...]  # lower-case substrings of a Hugging Face id or a path
    speculative_config: dict = field(default_factory=dict)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    loading: tuple[str, ...] = ()

    def speculative_flags(self) -> list[str]:
        return ["--speculative-config", json.dumps(self.speculative_config)]

    def parser_flags(self) -> list[str]:
        return [
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            self.tool_call_parser,
            "--reasoning-parser",
            self.reasoning_parser,
        ]


KIMI_K31_PRO = ModelFamily(
    name="kimi-k3.1-pro",
    id_patterns=("kimi-k3.1-pro",),
    speculative_config={
        "model": "Inferact/Kimi-K3.1-Pro-DSpark-preview",
        "num_speculative_tokens": 5,
        "method": "dspark",
        "draft_sample_method": "probabilistic",
    },
    tool_call_parser="kimi_k3",
    reasoning_parser="kimi_k3",
    loading=("--trust-remote-code", "--load-format", "fastsafetensors"),
)
MISTRAL_LARGE_4 = ModelFamily(
    name="mistral-large-4",
    id_patterns=("mistral-large-4",),
    speculative_config={"method": "dspark", "num_speculative_tokens": 3},
    tool_call_parser="mistral",
    reasoning_parser="mistral",
)
FAMILIES = (KIMI_K31_PRO, MISTRAL_LARGE_4)


def model_family(model: str) -> ModelFamily | None:
    """The family of a Hugging Face id or a checkpoint path, by name; None: a model without a
    family recipe (it gets the platform's flags only)."""
    name = model.lower()
    for family in FAMILIES:
        if any(pattern in name for pattern in family.id_patterns):
            return family
    return None


def parallel_flags(deployment: Deployment) -> list[str]:
    """The vLLM flags of the deployment's single-node layout: TP, DCP, expert parallel."""
    flags = ["--tensor-parallel-size", str(deployment.tensor_parallel)]
    if deployment.decode_context_parallel > 1:
        flags += ["--decode-context-parallel-size", str(deployment.decode_context_parallel)]
    if deployment.expert_parallel:
        flags.append("--enable-expert-parallel")
    return flags


def data_parallel_flags(deployment: Deployment, rank_variable: str, rpc_port: int) -> list[str]:
    """Data-parallel ranks over ``deployment.nodes`` hosts, each host starting its own ranks:
    the head's address comes from ``$HEAD_IP`` and the host's first rank from ``rank_variable``
    (a per-host environment variable), as the seeds' TPU command does."""
    if deployment.data_parallel <= 1:
        return []
    local = max(1, deployment.data_parallel // deployment.nodes)
    flags = ["--data-parallel-size", str(deployment.data_parallel)]
    flags += ["--data-parallel-size-local", str(local)]
    if deployment.nodes > 1:
        flags += ["--data-parallel-start-rank", f"${rank_variable}"]
        flags += ["--data-parallel-address", "$HEAD_IP"]
        flags += ["--data-parallel-rpc-port", str(rpc_port)]
    return flags


def standard_decode_only(deployment: Deployment, platform: str) -> list[str]:
    """The rule of every platform without a special decode backend."""
    if deployment.decode_backend == "default":
        return []
    return [
        f"{platform}: decode backend {deployment.decode_backend!r} does not exist here (the "
        "latency_specialized backend is AMD's fused FlyDSL decode); drop --decode-backend"
    ]
