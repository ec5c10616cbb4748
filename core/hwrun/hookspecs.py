"""The hwrun plugin API: every hook a vendor plugin may implement.

Plugins implement hooks with :data:`hookimpl` (``from hwrun.hookspecs import hookimpl``). Each
hook is called once per plugin, on that plugin alone, so a result always belongs to the plugin
that returned it. Hooks evolve only by adding arguments: pluggy passes an implementation just the
arguments it names, so a plugin written for an older minor version keeps working.

Required: :func:`hwrun_api_version`, :func:`hwrun_platform`. Everything else is optional and
says what its absence means.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from hwrun.collectives.communicator import Communicator
    from hwrun.deployment import Deployment
    from hwrun.platform import Capabilities, PlatformInfo
    from hwrun.registry import OpRegistry

PROJECT = "hwrun"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def hwrun_api_version() -> str:
    """(required) The hook API version the plugin was built for, e.g. ``"1.0"``.

    A plugin whose major version differs from :data:`hwrun.API_VERSION` is listed as
    ``incompatible`` and not used; the minor version may be older (hooks only gain arguments).

    :return: a ``"MAJOR.MINOR"`` string.

    .. versionadded:: 1.0
    """


@hookspec(firstresult=True)
def hwrun_platform() -> PlatformInfo:
    """(required) The plugin's identity and how its devices are detected.

    :return: a :class:`hwrun.platform.PlatformInfo`. Its ``name`` is the ``--platform`` value
        and must be unique among loaded plugins; its ``device_source`` names the detector in
        :mod:`hwrun.devices` (``"nvml"``, ``"amdsmi"``, ``"tpu-info"``, ``"ppu"``, ``"cpu"``,
        ``"none"``).

    .. versionadded:: 1.0
    """


@hookspec
def hwrun_register_ops(registry: OpRegistry) -> None:
    """(optional) Register the plugin's op implementations.

    Call ``registry.register(OpImpl(...))`` once per implementation; each carries a
    ``validate(spec) -> list[str]`` answering why it cannot serve a spec, and a priority.
    Register nothing for an op the plugin does not implement: ``hwrun ops`` then shows it as
    absent (served by the reference only when fallback is allowed). Defaults to no ops.

    :param registry: the platform's own registry; every impl registered here belongs to it.

    .. versionadded:: 1.0
    """


@hookspec(firstresult=True)
def hwrun_capabilities() -> Capabilities:
    """(optional) What the platform claims: ops, formats, dtypes, features, as data.

    The conformance suite audits the claims: a claimed op or format that fails is a FAIL, one
    that passes without being claimed is reported. Defaults to claiming nothing.

    :return: a :class:`hwrun.platform.Capabilities`.

    .. versionadded:: 1.0
    """


@hookspec(firstresult=True)
def hwrun_communicator(world_size: int, rank: int) -> Communicator | None:
    """(optional) A communicator faster than the default torch.distributed one.

    :param world_size: number of ranks in the group.
    :param rank: this process's rank in it.
    :return: a :class:`hwrun.collectives.communicator.Communicator`, or None to use the
        default (torch.distributed: gloo on CPU, NCCL/RCCL on GPUs).

    .. versionadded:: 1.0
    """


@hookspec
def hwrun_validate_deployment(deployment: Deployment) -> list[str]:
    """(optional) Every reason this platform cannot run ``deployment``: fail closed.

    Return all reasons at once (an empty list means no objection), each a sentence that says
    what was asked, why it cannot run and what to change. Defaults to no objection.

    :param deployment: the :class:`hwrun.deployment.Deployment` to check.

    .. versionadded:: 1.0
    """
