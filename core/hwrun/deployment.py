"""What a user asks to run, as data, so every plugin can say why it cannot."""

from dataclasses import dataclass


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


def device_count_reasons(
    deployment: Deployment, platform: str, devices_found: int, what: str
) -> list[str]:
    """The reasons every accelerator platform shares: devices present and enough of them."""
    reasons = []
    wanted = deployment.num_devices or deployment.tensor_parallel
    if devices_found == 0:
        reasons.append(
            f"{platform}: no {what} detected on this machine; run on a machine with one, "
            "or choose --platform reference"
        )
    elif wanted > devices_found:
        reasons.append(
            f"{platform}: the deployment needs {wanted} devices (tensor parallel "
            f"{deployment.tensor_parallel}) but {devices_found} {what}(s) are present; "
            f"lower --tp to at most {devices_found}"
        )
    if deployment.tensor_parallel % deployment.decode_context_parallel:
        reasons.append(
            f"decode context parallel {deployment.decode_context_parallel} must divide tensor "
            f"parallel {deployment.tensor_parallel} (DCP ranks are carved out of the TP group)"
        )
    return reasons
