"""vLLM on Alibaba T-HEAD Zhenwu PPUs through vllm-sail (``hwrun serve --engine vllm
--platform ppu``).

Only the layouts T-HEAD validated for Kimi K3.1 Pro are accepted (the vLLM day-0 post):

- 810E: two nodes, TP32 / EP32, with the W4A16 MoE backend: ``--tp 32 --nodes 2 --ep``. One
  tensor-parallel group spans both nodes, so vLLM runs on a Ray cluster of the two.
- M890: four nodes, TP8 / DP4 / EP32 with DeepEP: ``--tp 8 --dp 4 --nodes 4 --ep``. Each node
  starts one data-parallel rank (``$NODE_RANK``, head at ``$HEAD_IP``); the experts' all-to-all
  runs on DeepEP (vLLM's ``deepep_high_throughput`` backend: the post names DeepEP, not its mode).

vllm-sail picks its W4A16 MoE kernels itself on the 810E; the post gives no flag for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwrun.deployment import Deployment
from hwrun.hookspecs import hookimpl
from hwrun.serve.recipe import ServeRecipe, data_parallel_flags, standard_decode_only
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
    reasons = standard_decode_only(deployment, NAME)
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
