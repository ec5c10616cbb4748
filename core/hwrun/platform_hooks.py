"""The identity hooks every platform plugin writes the same way, written once.

A plugin's first three hooks only restate data: the literal hook API version it was built
against, its :class:`PlatformInfo`, and the detector that lists its devices. Instead of writing
them out, a plugin module may bind them from :func:`platform_hooks`::

    hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
        "1.1", PlatformInfo(name="myvendor", vendor="myvendor", description="..."), detect_npus
    )

pluggy finds hooks by the module attribute's name, so these are ordinary hook
implementations; the rest of the plugin (ops, capabilities, deployment checks) stays its own.
"""

from __future__ import annotations

from collections.abc import Callable

from hwrun.hookspecs import hookimpl
from hwrun.platform import DeviceInfo, PlatformInfo

Detector = Callable[[], list[DeviceInfo]]


def platform_hooks(
    api_version: str, info: PlatformInfo, detect: Detector
) -> tuple[Callable[[], str], Callable[[], PlatformInfo], Callable[[], list[DeviceInfo]]]:
    """``hwrun_api_version`` returning ``api_version`` (a literal, never core's own),
    ``hwrun_platform`` returning ``info`` and ``hwrun_devices`` calling ``detect`` (one of
    :mod:`hwrun.devices`' helpers, or the plugin's own; it raises NoDevices when there are
    none)."""

    @hookimpl
    def hwrun_api_version() -> str:
        return api_version

    @hookimpl
    def hwrun_platform() -> PlatformInfo:
        return info

    @hookimpl
    def hwrun_devices() -> list[DeviceInfo]:
        return detect()

    return hwrun_api_version, hwrun_platform, hwrun_devices
