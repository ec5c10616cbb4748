"""The reference platform: every catalogue op served by its pure-PyTorch definition.

It is registered through the ``hwrun.plugins`` entry point like any vendor plugin. It runs on
whatever device the tensors are on (fp32 accumulation, no fusion), so it is the ground truth of
the conformance suite and the explicit fallback of the other platforms.
"""

from __future__ import annotations

from hwrun import __version__
from hwrun.devices import detect_cpu
from hwrun.hookspecs import hookimpl
from hwrun.ops.catalogue import catalogue
from hwrun.platform import Capabilities, PlatformInfo
from hwrun.platform_hooks import platform_hooks
from hwrun.registry import OpImpl, OpRegistry
from hwrun.serve.reference_recipe import hwrun_serve_recipe, hwrun_validate_deployment  # noqa: F401 (hooks)

NAME = "reference"


hwrun_api_version, hwrun_platform, hwrun_devices = platform_hooks(
    "1.1",
    PlatformInfo(
        name=NAME,
        vendor="hwrun",
        description="Pure-PyTorch reference of every op (exact, slow); runs on any torch device",
        version=__version__,
    ),
    detect_cpu,
)


@hookimpl
def hwrun_register_ops(registry: OpRegistry) -> None:
    for contract in catalogue().values():
        registry.register(
            OpImpl(
                op=contract.name,
                name=NAME,
                platform=registry.platform,
                fn=contract.reference,
                validate=contract.reference_validate,
                description="pure-PyTorch definition",
                batch_invariant=True,  # every reference computes each row on its own
            )
        )


@hookimpl
def hwrun_capabilities() -> Capabilities:
    return Capabilities(
        ops=frozenset(catalogue()),
        features=frozenset({"batch_invariant", "exact_reference"}),
    )
