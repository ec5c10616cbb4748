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
    num_devices: int | None = None


def device_count_reasons(deployment: Deployment, target: Target) -> list[str]:
    """The reasons every accelerator platform shares, from where it runs here: devices
    present, enough of them, DCP dividing TP. Called by core for every platform but the
    reference (see :meth:`hwrun.plugins.PluginSet.validate_deployment`)."""
    reasons = []
    wanted = deployment.num_devices or deployment.tensor_parallel
    if not target.devices:
        why = "; ".join(target.reasons) or "none found"
        reasons.append(
            f"{target.platform}: no device detected on this machine ({why}); run on a machine "
            "with one, or choose --platform reference"
        )
    elif wanted > target.count:
        reasons.append(
            f"{target.platform}: the deployment needs {wanted} devices (tensor parallel "
            f"{deployment.tensor_parallel}) but {target.count} ({target.describe()}) are "
            f"present; lower --tp to at most {target.count}"
        )
    if deployment.tensor_parallel % deployment.decode_context_parallel:
        reasons.append(
            f"decode context parallel {deployment.decode_context_parallel} must divide tensor "
            f"parallel {deployment.tensor_parallel} (DCP ranks are carved out of the TP group)"
        )
    return reasons
