"""vLLM on Alibaba T-HEAD Zhenwu PPUs through vllm-sail (``hwrun serve --engine vllm
--platform ppu``).

Only the layouts T-HEAD validated for Kimi K3.1 Pro are accepted (the vLLM day-0 post):

- 810E: two nodes, TP32 / EP32, with the W4A16 MoE backend: ``--tp 32 --nodes 2 --ep``. One
  tensor-parallel group spans both nodes, so vLLM runs on a Ray cluster of the two.
- M890: four nodes, TP8 / DP4 / EP32 with DeepEP: ``--tp 8 --dp 4 --nodes 4 --ep``. Each node
  starts one data-parallel rank (``$NODE_RANK``, head at ``$HEAD_IP``); the experts' all-to-all
  runs on DeepEP (vLLM's ``deepep_high_throughput`` backend: the post names DeepEP, not its mode).

vllm-sail picks its W4A16 MoE kernels itself on the 810E; the post gives no flag for it.

Rules beyond the layout (fail closed: the post validates these configurations and no others):

- the model is Kimi K3.1 Pro, the one model T-HEAD validated on both PPUs;
- no decode or prefill context parallelism: neither layout has it;
- the experts run as vllm-sail loads them (W4A16 on the 810E, which has no fp8 tensor-core
  products): ROCm's load-time MXFP4 requant (``VLLM_FP8_MOE_REQUANT``, ``..._ACT`` a8w4 / a4w4)
  is refused, it exists only in vLLM's ROCm build;
- the layout matches the PPUs of this node (checked when devices are: not under --dry-run).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwrun.deployment import Deployment
from hwrun.hookspecs import hookimpl
from hwrun.serve.recipe import (
    KIMI_K31_PRO,
    ServeRecipe,
    data_parallel_flags,
    model_family,
    standard_decode_only,
)
from hwrun.target import Target

NAME = "ppu"


@dataclass(frozen=True)
class ValidatedLayout:
    device: str  # the PPU model, as its name reports it
    tensor_parallel: int
    data_parallel: int
    nodes: int
    extra: tuple[str, ...]

    def matches(self, d: Deployment) -> bool:
        return (d.tensor_parallel, d.data_parallel, d.nodes, d.expert_parallel) == (
            self.tensor_parallel,
            self.data_parallel,
            self.nodes,
            True,
        )

    def describe(self) -> str:
        dp = f" --dp {self.data_parallel}" if self.data_parallel > 1 else ""
        return f"{self.device}: --tp {self.tensor_parallel}{dp} --nodes {self.nodes} --ep"


LAYOUTS = (
    ValidatedLayout("810E", 32, 1, 2, ("--distributed-executor-backend", "ray")),
    ValidatedLayout("M890", 8, 4, 4, ("--all2all-backend", "deepep_high_throughput")),
)


def layout_of(deployment: Deployment) -> ValidatedLayout | None:
    return next((layout for layout in LAYOUTS if layout.matches(deployment)), None)


@hookimpl
def hwrun_serve_recipe(deployment: Deployment) -> ServeRecipe:
    layout = layout_of(deployment)
    args = ["--tensor-parallel-size", str(deployment.tensor_parallel)]
    args += data_parallel_flags(deployment, "NODE_RANK", 29696)
    if deployment.expert_parallel:
        args.append("--enable-expert-parallel")
    notes = ()
    if layout is not None:
        args += layout.extra
        notes = (f"validated on {layout.device} (T-HEAD, vLLM day-0 post)",)
    return ServeRecipe(args=tuple(args), distribution="vllm-sail", notes=notes)


@hookimpl
def hwrun_validate_deployment(deployment: Deployment, target: Target) -> list[str]:
    reasons = standard_decode_only(deployment, NAME) + _validated_config_reasons(deployment)
    layout = layout_of(deployment)
    if layout is None:
        reasons.append(
            f"ppu: tensor parallel {deployment.tensor_parallel}, data parallel "
            f"{deployment.data_parallel} over {deployment.nodes} node(s)"
            f"{' with' if deployment.expert_parallel else ' without'} expert parallel is not "
            "a layout vllm-sail was validated with; use "
            + " or ".join(f"({layout.describe()})" for layout in LAYOUTS)
        )
    elif deployment.check_devices and target.devices:
        names = {device.name for device in target.devices}
        if not any(layout.device in name for name in names):
            reasons.append(
                f"ppu: the {layout.describe()} layout was validated on {layout.device}, and "
                f"this node has {', '.join(sorted(names))}; use the layout of this PPU"
            )
    return reasons


def _validated_config_reasons(d: Deployment) -> list[str]:
    """What the validated configurations leave out, whatever the layout."""
    reasons = []
    if model_family(d.model) is not KIMI_K31_PRO:
        reasons.append(
            f"ppu: vllm-sail's PPU layouts were validated for Kimi K3.1 Pro only, not "
            f"{d.model}; serve moonshotai/Kimi-K3.1-Pro (or a checkpoint of it)"
        )
    if d.decode_context_parallel > 1 or d.prefill_context_parallel > 1:
        reasons.append(
            f"ppu: context parallelism (DCP {d.decode_context_parallel}, PCP "
            f"{d.prefill_context_parallel}) is not part of the validated layouts; drop --dcp / "
            "--prefill-context-parallel-size"
        )
    if d.moe_requant is not None or d.moe_activation is not None:
        asked = ", ".join(
            f"{name}={value}"
            for name, value in (
                ("VLLM_FP8_MOE_REQUANT", d.moe_requant),
                ("VLLM_FP8_MOE_REQUANT_ACT", d.moe_activation),
            )
            if value is not None
        )
        reasons.append(
            f"ppu: {asked} is vLLM's ROCm load-time requant; vllm-sail runs the experts as it "
            "loads them (W4A16 on the 810E, which has no fp8 tensor-core products): unset it"
        )
    return reasons
