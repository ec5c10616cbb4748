"""Identity and capability records that plugins return. All frozen: they are data, not state."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceInfo:
    """One accelerator (or the host CPU for the reference platform)."""

    index: int
    vendor: str  # "nvidia" | "amd" | "tpu" | "ppu" | "cpu"
    name: str  # marketing name as the driver reports it, e.g. "NVIDIA H200"
    arch: str | None = None  # "sm_90", "gfx942", "v5e", ...
    memory_bytes: int | None = None
    driver: str | None = None


@dataclass(frozen=True)
class PlatformInfo:
    """Who a plugin is and how its devices are found.

    ``device_source`` names the detector in :mod:`hwrun.devices` that lists this platform's
    devices: ``"nvml"``, ``"amdsmi"``, ``"tpu-info"``, ``"ppu"``, ``"cpu"`` or ``"none"``.
    """

    name: str  # the --platform name, unique among loaded plugins
    vendor: str
    description: str
    device_source: str
    version: str = "0"


@dataclass(frozen=True)
class Capabilities:
    """What a platform claims, as data. The conformance suite audits these claims.

    ``ops`` lists the ops the plugin implements itself (not through reference fallback);
    ``formats`` the storage formats its implementations accept; ``dtypes`` the activation dtypes
    (torch names, e.g. "bfloat16"); ``features`` free-form capability tags such as
    "batch_invariant" or "native_fp8".
    """

    ops: frozenset[str] = field(default_factory=frozenset)
    formats: frozenset[str] = field(default_factory=frozenset)
    dtypes: frozenset[str] = field(default_factory=frozenset)
    features: frozenset[str] = field(default_factory=frozenset)
    notes: tuple[str, ...] = ()
