"""What a user asks to run, as data, so every plugin can say why it cannot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hwrun.target import Target


@dataclass(frozen=True)
class Deployment:
    """A serving configuration to validate before anything is loaded.

    Formats use the names of :mod:`hwrun.formats` (latent "fp8_ds_mla", index keys "fp8",
    MoE weights "mxfp4", ...).
    """

    model: str
    tensor_parallel: int = 1
    decode_context_parallel: int = 1
    latent_format: str = "fp8_ds_mla"
    index_format: str = "fp8"
    weight_format: str = "fp8_block128"
    max_context: int | None = None
    num_devices: int | None = None  # devices on each node; None: TP x DP / nodes
    # The layout and features of a launch (``hwrun serve --engine vllm``), read back from the
    # command it would run, so a rule sees what would really start.
    data_parallel: int = 1
    nodes: int = 1  # hosts the TP x DP ranks are spread over
    expert_parallel: bool = False
    prefill_context_parallel: int = 1
    decode_backend: str = "default"  # "latency_specialized": AMD's fused few-request decode
    moe_requant: str | None = None  # experts re-quantized at load ("mxfp4"), None: as stored
    moe_activation: str | None = None  # activations of re-quantized experts: "a8w4" / "a4w4"
    speculative_method: str | None = None  # "dspark", "eagle", ...; None: no speculation
    lora: bool = False
    kv_connector: str | None = None  # a KV transfer / offload connector, e.g. "NixlConnector"
    check_devices: bool = True  # False: only the rules about the request itself (--dry-run)

    @property
    def devices_per_node(self) -> int:
        return self.num_devices or max(
            1, self.tensor_parallel * self.data_parallel // max(1, self.nodes)
        )


def device_count_reasons(deployment: Deployment, target: Target) -> list[str]:
    """The reasons every accelerator platform shares, from where it runs here: the layout
    (:func:`layout_reasons`), then, unless ``check_devices`` is off, devices present and enough
    of them on this node. Called by core for every platform but the reference (see
    :meth:`hwrun.plugins.PluginSet.validate_deployment`)."""
    reasons = layout_reasons(deployment)
    wanted = deployment.devices_per_node
    if not deployment.check_devices:
        return reasons
    if not target.devices:
        why = "; ".join(target.reasons) or "none found"
        reasons.append(
            f"{target.platform}: no device detected on this machine ({why}); run on a machine "
            "with one, or choose --platform reference"
        )
    elif wanted > target.count:
        reasons.append(
            f"{target.platform}: the deployment needs {wanted} devices on this node (tensor "
            f"parallel {deployment.tensor_parallel} x data parallel "
            f"{deployment.data_parallel} over {deployment.nodes} node(s)) but {target.count} "
            f"({target.describe()}) are present; lower --tp to at most {target.count}"
        )
    return reasons


def layout_reasons(deployment: Deployment) -> list[str]:
    """Whether the parallel layout is one at all: sizes >= 1, DCP dividing TP, the ranks
    spread evenly over the nodes."""
    reasons = []
    sizes = {
        "--tp": deployment.tensor_parallel,
        "--dcp": deployment.decode_context_parallel,
        "--dp": deployment.data_parallel,
        "--nodes": deployment.nodes,
        "prefill context parallel": deployment.prefill_context_parallel,
    }
    for name, value in sizes.items():
        if value < 1:
            reasons.append(f"{name} must be at least 1, got {value}")
    if reasons:
        return reasons
    if deployment.tensor_parallel % deployment.decode_context_parallel:
        reasons.append(
            f"decode context parallel {deployment.decode_context_parallel} must divide tensor "
            f"parallel {deployment.tensor_parallel} (DCP ranks are carved out of the TP group)"
        )
    ranks = deployment.tensor_parallel * deployment.data_parallel
    if ranks % deployment.nodes:
        reasons.append(
            f"{ranks} ranks (tensor parallel {deployment.tensor_parallel} x data parallel "
            f"{deployment.data_parallel}) do not spread evenly over {deployment.nodes} nodes; "
            "choose --nodes dividing TP x DP"
        )
    return reasons
