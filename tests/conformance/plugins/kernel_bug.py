"""The hooks of a one-op negative-control platform: each ``hwrun_bug_*`` module here is a plugin
whose only kernel is the reference with one bug of the kind real kernels have, in one place
(batch 1, past row 1000, rows picked by the data, the last partial block of a paged cache, rows
over more than one tile). The conformance suite must end the cases that reach the bug in FAIL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hwrun import API_VERSION
from hwrun.hookspecs import hookimpl
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.registry import OpImpl, OpRegistry


def bug_hooks(name: str, op: str, fn: Callable[..., Any], bug: str) -> tuple[Callable, ...]:
    """``hwrun_api_version``, ``hwrun_platform``, ``hwrun_register_ops``, ``hwrun_capabilities``
    of a platform ``name`` serving ``op`` with ``fn`` (claimed, so the audit judges it)."""

    @hookimpl
    def hwrun_api_version() -> str:
        return API_VERSION

    @hookimpl
    def hwrun_platform() -> PlatformInfo:
        return PlatformInfo(name=name, vendor="test", description=bug, device_source="none")

    @hookimpl
    def hwrun_register_ops(registry: OpRegistry) -> None:
        registry.register(OpImpl(op=op, name="buggy", platform=registry.platform, fn=fn))

    @hookimpl
    def hwrun_capabilities() -> Capabilities:
        return Capabilities(ops=frozenset({op}))

    return hwrun_api_version, hwrun_platform, hwrun_register_ops, hwrun_capabilities
