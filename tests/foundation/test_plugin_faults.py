"""Every plugin fault is contained where it is found, as the plugin loads: the plugin is
broken with the reason, every other platform keeps working."""

import json

import pytest

from hwrun import API_VERSION
from hwrun.plugins import load_plugins

from .plugin_modules import faulty_plugin, good_plugin, write_plugin
from .test_cli import subprocess_hwrun

FAULTS = {
    "raising_register": (
        """
        @hookimpl
        def hwrun_register_ops(registry):
            raise RuntimeError("kernel library 3.1 missing")
        """,
        "hwrun_register_ops raised RuntimeError: kernel library 3.1 missing",
    ),
    "garbage_register": (
        """
        @hookimpl
        def hwrun_register_ops(registry):
            registry.register({"op": "attn.lse_combine", "fn": print})
        """,
        "register() takes an hwrun.registry.OpImpl, got dict",
    ),
    "unknown_op": (
        """
        @hookimpl
        def hwrun_register_ops(registry):
            registry.register(OpImpl(op="indexer.logit_paged", name="fast",
                                     platform=registry.platform, fn=print))
        """,
        "unknown op 'indexer.logit_paged'; register under a catalogue op name "
        "(did you mean indexer.logits_paged",
    ),
    "malformed_impl": (
        """
        @hookimpl
        def hwrun_register_ops(registry):
            registry.register(OpImpl(op="attn.lse_combine", name="fast",
                                     platform=registry.platform, fn=None, priority="high"))
        """,
        "malformed OpImpl 'fast' for 'attn.lse_combine': fn must be callable, got NoneType; "
        "priority must be an int, got 'high'",
    ),
    "string_validate": (
        """
        @hookimpl
        def hwrun_register_ops(registry):
            registry.register(OpImpl(op="attn.lse_combine", name="fast", fn=print,
                                     platform=registry.platform,
                                     validate=lambda spec: "needs a GPU"))
        """,
        "the validate of attn.lse_combine impl 'fast' returned str 'needs a GPU', expected a "
        "list of reasons",
    ),
    "capabilities_type": (
        """
        @hookimpl
        def hwrun_capabilities():
            return {"ops": ["attn.lse_combine"]}
        """,
        "hwrun_capabilities returned dict {'ops': ['attn.lse_combine']}, expected "
        "hwrun.platform.Capabilities",
    ),
    "capabilities_fields": (
        """
        @hookimpl
        def hwrun_capabilities():
            return Capabilities(ops="attn.lse_combine")
        """,
        "Capabilities with ops='attn.lse_combine'; ops must be a frozenset of str",
    ),
    "raising_capabilities": (
        """
        @hookimpl
        def hwrun_capabilities(target):
            raise ValueError("no claims today")
        """,
        "hwrun_capabilities raised ValueError: no claims today",
    ),
    "garbage_devices": (
        """
        @hookimpl
        def hwrun_devices():
            return "one GPU"
        """,
        "hwrun_devices returned str 'one GPU', expected a list of hwrun.platform.DeviceInfo",
    ),
}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_breaks_only_its_plugin(plugin_dir, fault):
    hooks, reason = FAULTS[fault]
    bad = faulty_plugin(plugin_dir, fault, hooks)
    good = good_plugin(plugin_dir, "fine")
    plugin_set = load_plugins([bad, good])
    (plugin,) = [p for p in plugin_set.plugins if p.name == fault]
    assert plugin.status == "broken"
    assert reason in plugin.reason
    assert fault not in plugin_set.names()
    assert {"reference", "nvidia", "fine"} <= set(plugin_set.names())
    assert [i.name for i in plugin_set.registry("fine").impls("attn.lse_combine")] == ["fast"]
    # The broken plugin's hooks are no longer called.
    assert plugin_set.capabilities("fine").ops == {"attn.lse_combine"}


def test_unknown_device_source_is_broken(plugin_dir):
    module = write_plugin(
        plugin_dir,
        """
        from hwrun.hookspecs import hookimpl
        from hwrun.platform import PlatformInfo

        @hookimpl
        def hwrun_api_version():
            return "1.0"

        @hookimpl
        def hwrun_platform():
            return PlatformInfo(name="npu", vendor="x", description="x", device_source="npu-smi")
        """,
    )
    (plugin,) = [p for p in load_plugins([module]).plugins if p.name == module]
    assert plugin.status == "broken"
    assert "unknown device_source 'npu-smi'" in plugin.reason
    assert "implement hwrun_devices" in plugin.reason


def test_api_version_that_is_not_a_version_is_broken(plugin_dir):
    module = good_plugin(plugin_dir, "vague", api="latest")
    (plugin,) = [p for p in load_plugins([module]).plugins if p.name == module]
    assert plugin.status == "broken" and "'latest'" in plugin.reason


def test_installed_plugins_declare_their_own_api_version(monkeypatch):
    """A plugin returning core's API_VERSION would pass any check; each returns a literal."""
    monkeypatch.setattr("hwrun.plugins.API_VERSION", "2.0")
    plugin_set = load_plugins([])
    for plugin in plugin_set.plugins:
        assert plugin.status == "incompatible", plugin.name
        assert f"built for hook API {API_VERSION}, this hwrun speaks 2.0" in plugin.reason


def test_a_deployment_check_that_raises_is_a_reason(plugin_dir):
    module = faulty_plugin(
        plugin_dir,
        "closed",
        """
        @hookimpl
        def hwrun_validate_deployment(deployment):
            raise RuntimeError("cannot tell")
        """,
    )
    from hwrun.deployment import Deployment

    reasons = load_plugins([module]).validate_deployment("closed", Deployment(model="m"))
    assert "closed: its deployment check raised RuntimeError: cannot tell" in reasons


def test_hwrun_ops_all_works_with_every_bad_plugin_reported(tmp_path):
    modules = [faulty_plugin(tmp_path, name, hooks) for name, (hooks, _) in FAULTS.items()]
    env = {"HWRUN_PLUGINS": ",".join(modules), "PYTHONPATH": str(tmp_path)}
    result = subprocess_hwrun("ops", "--platform", "all", "--json", extra_env=env)
    assert result.returncode == 0, result.stderr
    platforms = {row["platform"] for row in json.loads(result.stdout)}
    assert platforms == {"reference", "nvidia", "amd", "tpu", "ppu"}
    for name, (_, reason) in FAULTS.items():
        assert f"hwrun: {name} is broken: " in result.stderr
        assert reason in result.stderr
    table = subprocess_hwrun("ops", "--platform", "all", extra_env=env)
    assert table.returncode == 0 and "raising_register is broken" in table.stdout
