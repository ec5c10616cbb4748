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
    from hwrun.platform import Capabilities, DeviceInfo, PlatformInfo
    from hwrun.registry import OpRegistry
    from hwrun.serve.recipe import ServeRecipe
    from hwrun.target import Target

PROJECT = "hwrun"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def hwrun_api_version() -> str:
    """(required) The hook API version the plugin was built for, e.g. ``"1.0"``.

    A plugin whose major version differs from :data:`hwrun.API_VERSION` is listed as
    ``incompatible`` and not used; the minor version may be older (hooks only gain arguments).

    Return the literal version the plugin was written against (``return "1.1"``), never
    :data:`hwrun.API_VERSION`: that is core's own and would make the check always pass.

    :return: a ``"MAJOR.MINOR"`` string.

    .. versionadded:: 1.0
    """


@hookspec(firstresult=True)
def hwrun_platform() -> PlatformInfo:
    """(required) The plugin's identity.

    :return: a :class:`hwrun.platform.PlatformInfo`. Its ``name`` is the ``--platform`` value
        and must be unique among loaded plugins. Its ``device_source`` is read only when the
        plugin does not implement :func:`hwrun_devices` (API 1.0 plugins); an unknown source
        makes the plugin ``broken``.

    .. versionadded:: 1.0
    """


@hookspec(firstresult=True)
def hwrun_devices() -> list[DeviceInfo]:
    """(optional) The platform's devices on this machine; the :class:`hwrun.target.Target`
    every other part of hwrun uses is built from them, once.

    Give each :class:`hwrun.platform.DeviceInfo` its torch ``device_type`` (``"cuda"`` for
    NVIDIA, ROCm and SAIL devices), ``arch`` and memory. When there are none, raise
    :class:`hwrun.devices.NoDevices` with the reason (``hwrun platforms`` shows it); any other
    exception is caught and shown the same way. The helpers in :mod:`hwrun.devices`
    (``detect_nvml``, ``detect_amdsmi``, ``detect_tpu_info``, ``detect_ppu``) do both.
    Devices torch cannot reach are dropped by core, with the reason. Defaults to the detector
    named by ``PlatformInfo.device_source``.

    :return: a list of :class:`hwrun.platform.DeviceInfo`; anything else makes the plugin
        ``broken``.

    .. versionadded:: 1.1
    """


@hookspec
def hwrun_register_ops(registry: OpRegistry) -> None:
    """(optional) Register the plugin's op implementations.

    Call ``registry.register(OpImpl(...))`` once per implementation; each carries a
    ``validate(spec) -> list[str]`` answering why it cannot serve a spec, and a priority.
    Register nothing for an op the plugin does not implement: ``hwrun ops`` then shows it as
    absent (served by the reference only when fallback is allowed). Defaults to no ops.

    Called once, when the plugin loads. If it raises, registers something that is not an
    ``OpImpl``, an op that is not in the catalogue, or an impl whose ``validate`` does not
    return a list, the plugin is ``broken`` with that reason and the other platforms go on.

    :param registry: the platform's own registry; every impl registered here belongs to it.

    .. versionadded:: 1.0
    """


@hookspec(firstresult=True)
def hwrun_capabilities(target: Target) -> Capabilities:
    """(optional) What the platform claims: ops, formats, dtypes, features, as data.

    The conformance suite audits the claims: a claimed op or format that fails is a FAIL, one
    that passes without being claimed is reported. Defaults to claiming nothing.

    :param target: where the platform runs here; claim what serves there (a plugin may
        compute its claims from its impls' ``validate`` on ``target.spec(op)``).
    :return: a :class:`hwrun.platform.Capabilities`; anything else makes the plugin ``broken``.

    .. versionadded:: 1.0
    .. versionchanged:: 1.1
        ``target`` argument.
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
def hwrun_validate_deployment(deployment: Deployment, target: Target) -> list[str]:
    """(optional) Every reason this platform cannot run ``deployment``: fail closed.

    Return all reasons at once (an empty list means no objection), each a sentence that says
    what was asked, why it cannot run and what to change. Core checks the device count itself
    (devices present, enough for the tensor-parallel size, DCP dividing TP) from the Target;
    this hook adds what only the platform knows. Defaults to no objection. A hook that raises
    or returns something other than a list becomes a reason (fail closed).

    :param deployment: the :class:`hwrun.deployment.Deployment` to check.
    :param target: where the platform runs here.

    .. versionadded:: 1.0
    .. versionchanged:: 1.1
        ``target`` argument; core checks the device count.
    """


@hookspec(firstresult=True)
def hwrun_serve_recipe(deployment: Deployment) -> ServeRecipe | None:
    """(optional) How vLLM serves ``deployment`` on this platform (``hwrun serve --engine
    vllm``): the flags after ``vllm serve MODEL`` and the environment, as the platform's
    validated recipes give them.

    Build the flags from the deployment (tensor / decode-context / data parallel sizes, nodes,
    expert parallel, decode backend) and the model family
    (:func:`hwrun.serve.recipe.model_family`). Core then appends the user's extra vLLM flags,
    reads the whole command back into a Deployment and asks
    :func:`hwrun_validate_deployment` about it before anything is launched. Flags may name
    per-node environment variables as ``$NAME`` (the head address, a worker's rank): a launch
    expands them and refuses when one is unset; ``--dry-run`` prints them as they are.
    Defaults to None: the platform has no vLLM recipe and the launcher refuses it.

    :param deployment: the :class:`hwrun.deployment.Deployment` the user asked for; its
        ``model`` is a Hugging Face id or a local path.
    :return: a :class:`hwrun.serve.recipe.ServeRecipe`, or None.

    .. versionadded:: 1.1
    """
