"""Identity and capability records that plugins return. All frozen: they are data, not state."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceInfo:
    """One accelerator (or the host CPU for the reference platform).

    ``device_type`` is the torch device type tensors for it live on: ``"cuda"`` for NVIDIA GPUs,
    for AMD GPUs under ROCm and for Zhenwu PPUs under SAIL torch; ``"cpu"`` for the host.
    """

    index: int
    vendor: str  # "nvidia" | "amd" | "tpu" | "ppu" | "cpu" | a third party's name
    name: str  # marketing name as the driver reports it, e.g. "NVIDIA H200"
    arch: str | None = None  # "sm_90", "gfx942", "v5e", ...
    memory_bytes: int | None = None
    driver: str | None = None
    device_type: str = "cpu"  # torch device type: "cuda", "cpu", "xla", ...


@dataclass(frozen=True)
class PlatformInfo:
    """Who a plugin is.

    ``device_source`` is how API 1.0 plugins named their devices: a detector in
    :mod:`hwrun.devices` (``"nvml"``, ``"amdsmi"``, ``"tpu-info"``, ``"ppu"``, ``"cpu"`` or
    ``"none"``). It is used only when the plugin does not implement ``hwrun_devices``, which is
    how a plugin reports its devices since API 1.1; an unknown name makes the plugin broken.
    """

    name: str  # the --platform name, unique among loaded plugins
    vendor: str
    description: str
    device_source: str = "none"
    version: str = "0"


@dataclass(frozen=True)
class Capabilities:
    """What a platform claims, as data. The conformance suite audits these claims.

    ``ops`` lists the ops the plugin implements itself (not through reference fallback);
    ``formats`` the storage formats its implementations accept; ``dtypes`` the activation dtypes
    (torch names, e.g. "bfloat16"); ``features`` free-form capability tags such as
    "batch_invariant" or "native_fp8"; ``hardware_validated`` which impls have passed
    conformance on the vendor's own devices.
    """

    ops: frozenset[str] = field(default_factory=frozenset)
    formats: frozenset[str] = field(default_factory=frozenset)
    dtypes: frozenset[str] = field(default_factory=frozenset)
    features: frozenset[str] = field(default_factory=frozenset)
    notes: tuple[str, ...] = ()
    # (optional, defaults to ()) The impls that have passed the conformance suite on the
    # vendor's own hardware, as (op, impl name, arch) triples, e.g. ("indexer.topk", "triton",
    # "sm_90"). `hwrun report` shows every impl not named here as "not validated on hardware":
    # it has run only on CPU, in an interpreter, or not at all.
    hardware_validated: tuple[tuple[str, str, str], ...] = ()
