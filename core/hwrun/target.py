"""Target: where a platform runs here, decided once.

A :class:`Target` answers one question for every part of hwrun: *on which torch device type,
with which devices and architecture, does platform P run on this machine?* It is built from the
plugin's ``hwrun_devices`` answer (see :mod:`hwrun.hookspecs`) by :func:`resolve_target`, and
cached by the plugin set (:meth:`hwrun.plugins.PluginSet.target`). ``hwrun ops``, the
conformance runner, the capability claims (``hwrun_capabilities(target)``) and the deployment
checks (``hwrun_validate_deployment(deployment, target)``) all take it, and op specs are built
from it (:meth:`Target.place`), so an impl's ``validate`` sees the real device and arch.

Rules:

- The devices the plugin reports decide the device type (the first device's ``device_type``).
- Devices torch cannot reach (a CPU build of torch on a GPU machine, fewer visible devices than
  the driver lists) are dropped, and the reason is kept: the platform then runs on ``"cpu"``
  (its Triton tier only in Triton's interpreter, the reference always).
- No devices (the plugin raised :class:`hwrun.devices.NoDevices`, or anything else) means a
  ``"cpu"`` target with the reason; detection never crashes hwrun.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hwrun.platform import DeviceInfo
from hwrun.registry import OpSpec

CPU = "cpu"


@dataclass(frozen=True)
class Target:
    """Where one platform runs here.

    ``devices`` are the devices the platform's tensors go to (empty for a vendor platform that
    has none here, which then runs on the CPU); ``reasons`` say why a platform has no device,
    or fewer than its driver lists.
    """

    platform: str
    device_type: str = CPU  # torch device type: "cuda", "cpu", "xla", ...
    devices: tuple[DeviceInfo, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def arch(self) -> str | None:
        """The architecture impls validate against: the first device's (e.g. "sm_90")."""
        return self.devices[0].arch if self.devices else None

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def memory_bytes(self) -> int | None:
        """Memory of one device (the first; a platform's devices are one model in practice)."""
        return self.devices[0].memory_bytes if self.devices else None

    def torch_device(self, index: int = 0) -> str:
        """The torch device string of device ``index`` ("cuda:0"), or "cpu"."""
        return CPU if self.device_type == CPU else f"{self.device_type}:{index}"

    def place(self, spec: OpSpec) -> OpSpec:
        """``spec`` on this target: its device type and architecture filled in."""
        arch = self.arch if self.device_type != CPU else None
        return replace(spec, device_type=self.device_type, arch=arch)

    def spec(self, op: str, **fields: Any) -> OpSpec:
        """An :class:`OpSpec` of ``op`` on this target."""
        return self.place(OpSpec(op, **fields))

    def on(self, device_type: str) -> Target:
        """This platform forced onto ``device_type`` (e.g. conformance ``--device cpu``)."""
        if device_type == self.device_type:
            return self
        devices = tuple(d for d in self.devices if d.device_type == device_type)
        reason = f"forced onto {device_type!r} (the platform's own is {self.device_type!r})"
        return replace(self, device_type=device_type, devices=devices, reasons=(reason,))

    def describe(self) -> str:
        """One line for tables: "cuda: 8 x NVIDIA H200 (sm_90, 141 GiB)" or "cpu"."""
        if not self.devices:
            return self.device_type
        first = self.devices[0]
        details = [d for d in (first.arch, _gib(first.memory_bytes)) if d and d != first.name]
        suffix = f" ({', '.join(details)})" if details else ""
        names = {d.name for d in self.devices}
        name = first.name if len(names) == 1 else ", ".join(sorted(names))
        return f"{self.device_type}: {self.count} x {name}{suffix}"


def resolve_target(
    platform: str, devices: list[DeviceInfo], reasons: tuple[str, ...] = ()
) -> Target:
    """The Target of ``platform`` from the devices its plugin reported (see the module's rules).

    ``reasons`` are why the plugin found none (its :class:`hwrun.devices.NoDevices` message).
    """
    if not devices:
        return Target(platform, CPU, (), reasons or ("the plugin reports no devices",))
    device_type = devices[0].device_type
    mine = tuple(d for d in devices if d.device_type == device_type)
    if device_type == CPU:
        return Target(platform, CPU, mine, reasons)
    visible, why = _torch_reach(device_type, len(mine))
    names = f"{len(mine)} x {mine[0].name}"
    if visible == 0:
        return Target(platform, CPU, (), (*reasons, f"found {names}, but {why}"))
    if visible < len(mine):
        reasons = (*reasons, f"found {names}, {why}; using the first {visible}")
    return Target(platform, device_type, mine[:visible], reasons)


def _torch_reach(device_type: str, wanted: int) -> tuple[int, str]:
    """How many of ``wanted`` devices of ``device_type`` this torch reaches, and if not all, why."""
    import torch

    backend = getattr(torch, device_type, None)
    if backend is None or not hasattr(backend, "is_available"):
        return 0, f"this torch ({torch.__version__}) has no {device_type!r} device type"
    try:
        if not backend.is_available():
            return 0, (
                f"torch.{device_type}.is_available() is False: this torch ({torch.__version__}) "
                "cannot reach them (a CPU-only build?)"
            )
        visible = int(backend.device_count())
    except Exception as exc:
        return 0, f"torch.{device_type} failed: {type(exc).__name__}: {exc}"
    if visible >= wanted:
        return wanted, ""
    return visible, f"torch sees {visible} (CUDA_VISIBLE_DEVICES or the like)"


def _gib(memory_bytes: int | None) -> str | None:
    return f"{memory_bytes / 2**30:.0f} GiB" if memory_bytes else None
