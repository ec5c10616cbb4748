"""Plugin discovery: entry points plus HWRUN_PLUGINS, API-version check, fault containment,
each platform's Target, platform choice.

A plugin that fails to import or to describe itself is recorded as ``broken`` with the
exception's message; one built for another major API version is ``incompatible`` with both
versions named. Every plugin is then checked once, as it loads: its Target is resolved (device
detection never fails a plugin: no devices is an answer), its ``hwrun_register_ops`` fills its
registry, its ``hwrun_capabilities`` is read. A fault there (a hook that raises or returns the
wrong type, an unknown op, a malformed impl, a ``validate`` that does not return a list) makes
the plugin ``broken`` with the reason and takes it out of the hook calls; hwrun keeps working
with the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from hwrun import API_VERSION, hookspecs, knobs
from hwrun.deployment import Deployment, device_count_reasons
from hwrun.devices import DETECTORS, NoDevices, detect
from hwrun.errors import HwrunError
from hwrun.platform import Capabilities, DeviceInfo, PlatformInfo
from hwrun.registry import OpRegistry
from hwrun.target import Target, resolve_target

if TYPE_CHECKING:
    from hwrun.collectives.communicator import Communicator

ENTRY_POINT_GROUP = "hwrun.plugins"
REFERENCE = "reference"


@dataclass(frozen=True)
class LoadedPlugin:
    """One plugin as discovered. ``status`` is "loaded", "broken" or "incompatible"."""

    name: str
    origin: str  # "entry point NAME" or "HWRUN_PLUGINS"
    module: str
    status: str
    reason: str | None = None
    info: PlatformInfo | None = None
    api_version: str | None = None
    version: str | None = None
    plugin: Any = field(default=None, compare=False, repr=False)


class PluginFault(HwrunError):
    """A plugin hook broke its contract; the plugin is reported broken with this message."""


class PluginSet:
    """The discovered plugins and the per-plugin hook calls the rest of hwrun uses."""

    def __init__(self, manager: pluggy.PluginManager, plugins: list[LoadedPlugin]):
        self.manager = manager
        self.plugins = plugins
        self._targets: dict[str, Target] = {}
        self._registries: dict[str, OpRegistry] = {}
        self._capabilities: dict[Target, Capabilities] = {}

    def loaded(self) -> list[LoadedPlugin]:
        return [p for p in self.plugins if p.status == "loaded"]

    def names(self) -> list[str]:
        return [p.name for p in self.loaded()]

    def get(self, name: str) -> LoadedPlugin:
        for plugin in self.loaded():
            if plugin.name == name:
                return plugin
        raise HwrunError(self._unknown_platform_message(name))

    def call(self, plugin: LoadedPlugin, hook: str, **kwargs: Any) -> Any:
        """Call ``hook`` on ``plugin`` alone (None when the plugin does not implement it)."""
        others = [p.plugin for p in self.loaded() if p.plugin is not plugin.plugin]
        caller = self.manager.subset_hook_caller(hook, remove_plugins=others)
        return caller(**kwargs)

    def target(self, name: str) -> Target:
        """Where platform ``name`` runs here, resolved once (see :mod:`hwrun.target`)."""
        if name not in self._targets:
            plugin = self.get(name)
            devices, reasons = self._devices_of(plugin)
            self._targets[name] = resolve_target(name, devices, reasons)
        return self._targets[name]

    def devices(self, name: str) -> list[DeviceInfo]:
        """The devices platform ``name`` runs on here (its Target's)."""
        return list(self.target(name).devices)

    def capabilities(self, name: str, target: Target | None = None) -> Capabilities:
        """What the platform claims on ``target`` (default: its own Target)."""
        target = target or self.target(name)
        if target not in self._capabilities:
            try:
                claims = self.call(self.get(name), "hwrun_capabilities", target=target)
            except Exception as exc:
                raise PluginFault(f"hwrun_capabilities raised {_describe(exc)}") from exc
            self._capabilities[target] = _checked_capabilities(claims)
        return self._capabilities[target]

    def registry(self, name: str) -> OpRegistry:
        """The platform's op registry, falling back to the reference's when allowed."""
        if name not in self._registries:
            plugin = self.get(name)
            fallback = None
            if name != REFERENCE and REFERENCE in self.names():
                fallback = self.registry(REFERENCE)
            registry = OpRegistry(name, fallback=fallback, known_ops=_catalogue_ops())
            try:
                self.call(plugin, "hwrun_register_ops", registry=registry)
            except Exception as exc:
                raise PluginFault(f"hwrun_register_ops raised {_describe(exc)}") from exc
            self._registries[name] = registry
        return self._registries[name]

    def validate_deployment(self, name: str, deployment: Deployment) -> list[str]:
        """Every reason ``deployment`` cannot run on platform ``name``: the device count from
        its Target (every platform but the reference, which runs on the host), then the
        plugin's own (fail closed: a raising or malformed hook is a reason too)."""
        target = self.target(name)
        reasons = []
        if name != REFERENCE:
            reasons += device_count_reasons(deployment, target)
        try:
            results = self.call(
                self.get(name), "hwrun_validate_deployment", deployment=deployment, target=target
            )
        except Exception as exc:
            return [*reasons, f"{name}: its deployment check raised {_describe(exc)}"]
        for result in results or []:
            if not isinstance(result, list | tuple) or not all(isinstance(r, str) for r in result):
                reasons.append(
                    f"{name}: its deployment check returned {type(result).__name__}, "
                    "not a list of reasons (a bug in the plugin)"
                )
                continue
            reasons.extend(result)
        return reasons

    def communicator(self, name: str, world_size: int, rank: int) -> Communicator:
        """Platform ``name``'s own communicator (``hwrun_communicator``) or the default one,
        which wraps the already-initialized torch.distributed group. Either must agree with the
        group it was asked for."""
        from hwrun.collectives.communicator import CollectiveError, TorchDistributedCommunicator

        offered = self.call(self.get(name), "hwrun_communicator", world_size=world_size, rank=rank)
        comm = offered if offered is not None else TorchDistributedCommunicator()
        if (comm.rank, comm.world_size) != (rank, world_size):
            source = f"platform {name!r}" if offered is not None else "torch.distributed"
            raise CollectiveError(
                f"asked for rank {rank} of {world_size}, but the communicator from {source} is "
                f"rank {comm.rank} of {comm.world_size}; initialize the group with the same "
                "world size"
            )
        return comm

    def choose_platform(self, requested: str | None = None) -> str:
        """``requested`` by name, or ``auto``: the first vendor plugin whose Target has devices
        here, else the reference platform."""
        requested = requested or knobs.default_platform()
        if requested != "auto":
            self.get(requested)
            return requested
        for plugin in self.loaded():
            if plugin.name != REFERENCE and self.target(plugin.name).devices:
                return plugin.name
        return REFERENCE

    def check(self, plugin: LoadedPlugin) -> None:
        """Resolve ``plugin``'s Target, registry and claims once; a fault makes it broken."""
        try:
            target = self.target(plugin.name)
            registry = self.registry(plugin.name)
            _check_validators(registry, target)
            self.capabilities(plugin.name)
        except PluginFault as fault:
            self._mark_broken(plugin, str(fault))

    def _devices_of(self, plugin: LoadedPlugin) -> tuple[list[DeviceInfo], tuple[str, ...]]:
        """The plugin's devices (its hook, else its device_source) and why there are none."""
        try:
            if hasattr(plugin.plugin, "hwrun_devices"):
                devices = self.call(plugin, "hwrun_devices")
            else:
                assert plugin.info is not None
                devices = detect(plugin.info.device_source)
        except NoDevices as none:
            return [], (str(none),)
        except Exception as exc:
            return [], (f"device detection raised {_describe(exc)}",)
        if not isinstance(devices, list | tuple) or not all(
            isinstance(d, DeviceInfo) for d in devices
        ):
            raise PluginFault(
                f"hwrun_devices returned {_shape(devices)}, expected a list of "
                "hwrun.platform.DeviceInfo (raise hwrun.devices.NoDevices when there are none)"
            )
        return list(devices), ()

    def _mark_broken(self, plugin: LoadedPlugin, reason: str) -> None:
        self.manager.unregister(plugin.plugin)
        self.plugins = [
            replace(p, status="broken", reason=reason) if p is plugin else p for p in self.plugins
        ]
        self._targets.pop(plugin.name, None)
        self._registries.pop(plugin.name, None)
        self._capabilities = {
            t: c for t, c in self._capabilities.items() if t.platform != plugin.name
        }

    def _unknown_platform_message(self, name: str) -> str:
        known = ", ".join(self.names()) or "none"
        message = f"unknown platform {name!r}; loaded platforms: {known}"
        unusable = [p for p in self.plugins if p.name == name and p.status != "loaded"]
        if unusable:
            message += f" ({name} is {unusable[0].status}: {unusable[0].reason})"
        return message


def load_plugins(extra_modules: list[str] | None = None) -> PluginSet:
    """Discover every plugin: entry points (unless disabled) then HWRUN_PLUGINS modules; then
    check each loaded one (:meth:`PluginSet.check`), the reference first."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    candidates: list[tuple[str, str, Any]] = []  # (fallback name, origin, loader)

    if knobs.entry_points_disabled():
        candidates.append((REFERENCE, "builtin", "hwrun.reference_plugin"))
    else:
        # The reference first, then vendors by name: a stable order for tables and reports.
        found = sorted(
            entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name != REFERENCE, e.name)
        )
        for ep in found:
            candidates.append((ep.name, f"entry point {ep.name}", ep))
    modules = knobs.extra_plugin_modules() if extra_modules is None else extra_modules
    for module_path in modules:
        candidates.append((module_path, "HWRUN_PLUGINS", module_path))

    plugins: list[LoadedPlugin] = []
    seen_modules: set[int] = set()
    for fallback_name, origin, loader in candidates:
        result = _load_one(manager, fallback_name, origin, loader, plugins, seen_modules)
        if result is not None:
            plugins.append(result)
    plugin_set = PluginSet(manager, plugins)
    for plugin in plugin_set.loaded():
        plugin_set.check(plugin)
    return plugin_set


def _load_one(
    manager: pluggy.PluginManager,
    fallback_name: str,
    origin: str,
    loader: Any,
    plugins: list[LoadedPlugin],
    seen_modules: set[int],
) -> LoadedPlugin | None:
    module_path = loader if isinstance(loader, str) else loader.value
    try:
        module = importlib.import_module(loader) if isinstance(loader, str) else loader.load()
    except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        return LoadedPlugin(fallback_name, origin, module_path, "broken", _describe(exc))
    if id(module) in seen_modules:
        return None  # the same module found twice (installed and on HWRUN_PLUGINS)
    seen_modules.add(id(module))

    try:
        info, api_version = _identify(module)
    except Exception as exc:
        return LoadedPlugin(fallback_name, origin, module_path, "broken", _describe(exc))
    version = info.version
    if _major(api_version) != _major(API_VERSION):
        return LoadedPlugin(
            info.name,
            origin,
            module_path,
            "incompatible",
            f"built for hook API {api_version}, this hwrun speaks {API_VERSION}; "
            f"install a {info.name} plugin built for API {_major(API_VERSION)}.x",
            info,
            api_version,
            version,
        )
    for other in plugins:
        if other.status == "loaded" and other.name == info.name:
            return LoadedPlugin(
                info.name,
                origin,
                module_path,
                "broken",
                f"platform name {info.name!r} is already provided by {other.module}; "
                "uninstall one of them or rename the platform",
                info,
                api_version,
                version,
            )
    try:
        manager.register(module, name=f"{info.name}:{module_path}")
    except Exception as exc:  # pluggy rejects hookimpls that do not match a spec
        return LoadedPlugin(info.name, origin, module_path, "broken", _describe(exc), info)
    return LoadedPlugin(
        info.name, origin, module_path, "loaded", None, info, api_version, version, module
    )


def _identify(module: ModuleType) -> tuple[PlatformInfo, str]:
    """Read the two required hooks straight off the module, before it is registered."""
    missing = [h for h in ("hwrun_api_version", "hwrun_platform") if not hasattr(module, h)]
    if missing:
        raise HwrunError(f"{module.__name__} does not implement the required hooks: {missing}")
    api_version = module.hwrun_api_version()
    if not isinstance(api_version, str) or not _major(api_version).isdigit():
        raise HwrunError(
            f"{module.__name__}.hwrun_api_version() returned {api_version!r}, expected the "
            'literal "MAJOR.MINOR" the plugin was built against, e.g. "1.1"'
        )
    info = module.hwrun_platform()
    if not isinstance(info, PlatformInfo):
        raise HwrunError(
            f"{module.__name__}.hwrun_platform() returned {type(info).__name__}, "
            "expected hwrun.platform.PlatformInfo"
        )
    if not hasattr(module, "hwrun_devices") and info.device_source not in DETECTORS:
        known = ", ".join(sorted(DETECTORS))
        raise HwrunError(
            f"{module.__name__}: unknown device_source {info.device_source!r} (known: {known}); "
            "implement hwrun_devices instead, or name a known source"
        )
    return info, api_version


def _check_validators(registry: OpRegistry, target: Target) -> None:
    """Every impl's validate must answer a list of reasons; asked once with the op's default
    spec on the platform's Target. One that raises is left to selection (a reason there)."""
    from hwrun.ops.catalogue import catalogue

    contracts = catalogue()
    for op in registry.ops():
        spec = target.place(contracts[op].default_spec)
        for impl in registry.impls(op):
            try:
                answer = impl.validate(spec)
            except Exception:
                continue
            if not isinstance(answer, list | tuple) or not all(isinstance(r, str) for r in answer):
                raise PluginFault(
                    f"the validate of {op} impl {impl.name!r} returned {_shape(answer)}, "
                    "expected a list of reasons (str), empty when it can serve the spec"
                )


def _checked_capabilities(claims: Any) -> Capabilities:
    if claims is None:
        return Capabilities()
    if not isinstance(claims, Capabilities):
        raise PluginFault(
            f"hwrun_capabilities returned {_shape(claims)}, expected hwrun.platform.Capabilities"
        )
    for name in ("ops", "formats", "dtypes", "features"):
        value = getattr(claims, name)
        if not isinstance(value, set | frozenset) or not all(isinstance(v, str) for v in value):
            raise PluginFault(
                f"hwrun_capabilities returned Capabilities with {name}={value!r}; "
                f"{name} must be a frozenset of str"
            )
    validated = claims.hardware_validated
    if not isinstance(validated, tuple) or not all(
        isinstance(t, tuple) and len(t) == 3 and all(isinstance(v, str) for v in t)
        for t in validated
    ):
        raise PluginFault(
            f"hwrun_capabilities returned Capabilities with hardware_validated={validated!r}; "
            "it must be a tuple of (op, impl, arch) str triples"
        )
    return claims


def _catalogue_ops() -> frozenset[str]:
    from hwrun.ops.catalogue import catalogue

    return frozenset(catalogue())


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def _shape(value: Any) -> str:
    """A value's type and a short repr, for fault messages."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
