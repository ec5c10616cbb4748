"""Plugin discovery: entry points plus HWRUN_PLUGINS, API-version check, platform choice.

A plugin that fails to import or to describe itself is recorded as ``broken`` with the
exception's message; one built for another major API version is ``incompatible`` with both
versions named. hwrun keeps working with the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from hwrun import API_VERSION, hookspecs, knobs
from hwrun.deployment import Deployment
from hwrun.devices import detect
from hwrun.errors import HwrunError
from hwrun.platform import Capabilities, DeviceInfo, PlatformInfo
from hwrun.registry import OpRegistry

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


class PluginSet:
    """The discovered plugins and the per-plugin hook calls the rest of hwrun uses."""

    def __init__(self, manager: pluggy.PluginManager, plugins: list[LoadedPlugin]):
        self.manager = manager
        self.plugins = plugins
        self._registries: dict[str, OpRegistry] = {}

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

    def devices(self, name: str) -> list[DeviceInfo]:
        plugin = self.get(name)
        assert plugin.info is not None
        return detect(plugin.info.device_source)

    def capabilities(self, name: str) -> Capabilities:
        return self.call(self.get(name), "hwrun_capabilities") or Capabilities()

    def registry(self, name: str) -> OpRegistry:
        """The platform's op registry, falling back to the reference's when allowed."""
        if name not in self._registries:
            plugin = self.get(name)
            fallback = None
            if name != REFERENCE and REFERENCE in self.names():
                fallback = self.registry(REFERENCE)
            registry = OpRegistry(name, fallback=fallback)
            self.call(plugin, "hwrun_register_ops", registry=registry)
            self._registries[name] = registry
        return self._registries[name]

    def validate_deployment(self, name: str, deployment: Deployment) -> list[str]:
        results = self.call(self.get(name), "hwrun_validate_deployment", deployment=deployment)
        return [reason for result in results or [] for reason in result]

    def choose_platform(self, requested: str | None = None) -> str:
        """``requested`` by name, or ``auto``: the first vendor plugin whose devices are present,
        else the reference platform."""
        requested = requested or knobs.default_platform()
        if requested != "auto":
            self.get(requested)
            return requested
        for plugin in self.loaded():
            if plugin.name != REFERENCE and self.devices(plugin.name):
                return plugin.name
        return REFERENCE

    def _unknown_platform_message(self, name: str) -> str:
        known = ", ".join(self.names()) or "none"
        message = f"unknown platform {name!r}; loaded platforms: {known}"
        unusable = [p for p in self.plugins if p.name == name and p.status != "loaded"]
        if unusable:
            message += f" ({name} is {unusable[0].status}: {unusable[0].reason})"
        return message


def load_plugins(extra_modules: list[str] | None = None) -> PluginSet:
    """Discover every plugin: entry points (unless disabled) then HWRUN_PLUGINS modules."""
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
    return PluginSet(manager, plugins)


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
    api_version = str(module.hwrun_api_version())
    info = module.hwrun_platform()
    if not isinstance(info, PlatformInfo):
        raise HwrunError(
            f"{module.__name__}.hwrun_platform() returned {type(info).__name__}, "
            "expected hwrun.platform.PlatformInfo"
        )
    return info, api_version


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
