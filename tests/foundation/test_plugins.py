import pytest

from hwrun import API_VERSION
from hwrun.deployment import Deployment
from hwrun.errors import HwrunError
from hwrun.plugins import load_plugins

from .conftest import fake_amdsmi
from .plugin_modules import OP, good_plugin, write_plugin

VENDORS = {"nvidia", "amd", "tpu", "ppu"}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def by_name(plugin_set):
    return {p.name: p for p in plugin_set.plugins}


def test_installed_entry_points_load_reference_first():
    plugin_set = load_plugins([])
    names = [p.name for p in plugin_set.plugins]
    assert names[0] == "reference"
    assert set(names) >= VENDORS
    assert all(p.status == "loaded" for p in plugin_set.plugins)
    assert all(p.api_version == API_VERSION for p in plugin_set.plugins)


def test_good_plugin_from_module_path(plugin_dir):
    module = good_plugin(plugin_dir)
    plugin = by_name(load_plugins([module]))["demo"]
    assert (plugin.status, plugin.origin, plugin.version) == ("loaded", "HWRUN_PLUGINS", "9.9")


def test_plugin_that_raises_on_import_is_broken_with_its_message(plugin_dir):
    module = write_plugin(plugin_dir, "raise RuntimeError('vendor driver 1.2 is missing')\n")
    plugin_set = load_plugins([module])
    broken = by_name(plugin_set)[module]
    assert broken.status == "broken"
    assert "RuntimeError: vendor driver 1.2 is missing" in broken.reason
    assert "reference" in plugin_set.names()  # the others keep working


def test_missing_module_is_broken():
    broken = by_name(load_plugins(["no_such_hwrun_plugin_module"]))["no_such_hwrun_plugin_module"]
    assert broken.status == "broken"
    assert "ModuleNotFoundError" in broken.reason


def test_plugin_that_exits_on_import_is_broken(plugin_dir):
    module = write_plugin(plugin_dir, "import sys\nsys.exit(3)\n")
    assert by_name(load_plugins([module]))[module].status == "broken"


def test_other_major_api_version_is_incompatible_with_both_versions_named(plugin_dir):
    module = good_plugin(plugin_dir, name="future", api="2.0")
    plugin = by_name(load_plugins([module]))["future"]
    assert plugin.status == "incompatible"
    assert "2.0" in plugin.reason and API_VERSION in plugin.reason
    assert "future" not in load_plugins([module]).names()


def test_older_minor_api_version_loads(plugin_dir):
    module = good_plugin(plugin_dir, name="older", api="1.0")
    assert by_name(load_plugins([module]))["older"].status == "loaded"


def test_plugin_without_required_hooks_is_broken(plugin_dir):
    module = write_plugin(plugin_dir, "x = 1\n")
    plugin = by_name(load_plugins([module]))[module]
    assert plugin.status == "broken"
    assert "hwrun_platform" in plugin.reason


def test_duplicate_platform_name_keeps_the_first(plugin_dir):
    first, second = good_plugin(plugin_dir, "twin"), good_plugin(plugin_dir, "twin")
    plugin_set = load_plugins([first, second])
    twins = [p for p in plugin_set.plugins if p.name == "twin"]
    assert [p.status for p in twins] == ["loaded", "broken"]
    assert first in twins[1].reason and "already provided" in twins[1].reason


def test_same_module_twice_is_loaded_once(plugin_dir):
    module = good_plugin(plugin_dir, "once")
    plugin_set = load_plugins([module, module])
    assert [p.name for p in plugin_set.plugins].count("once") == 1


def test_env_var_is_read(plugin_dir, monkeypatch):
    module = good_plugin(plugin_dir, "fromenv")
    monkeypatch.setenv("HWRUN_PLUGINS", f" {module} , ")
    assert "fromenv" in load_plugins().names()


def test_disabled_entry_points_leave_only_the_reference(monkeypatch):
    monkeypatch.setenv("HWRUN_DISABLE_ENTRY_POINTS", "1")
    assert load_plugins([]).names() == ["reference"]


def test_hooks_are_called_per_plugin(plugin_dir):
    plugin_set = load_plugins([good_plugin(plugin_dir, "solo")])
    assert plugin_set.capabilities("solo").ops == {OP}
    assert "fast" not in [i.name for i in plugin_set.registry("reference").impls(OP)]
    registry = plugin_set.registry("solo")
    assert [i.name for i in registry.impls(OP)] == ["fast"]
    assert "fast" not in [i.name for i in plugin_set.registry("ppu").impls(OP)]
    reasons = plugin_set.validate_deployment("solo", Deployment(model="kimi-k3.1-pro"))
    assert reasons[-1] == "solo refuses everything"
    assert "solo: no device detected on this machine" in reasons[0]


def test_vendor_deployment_refusal_lists_every_reason():
    plugin_set = load_plugins([])
    reasons = plugin_set.validate_deployment(
        "nvidia", Deployment(model="kimi-k3.1-pro", tensor_parallel=8, decode_context_parallel=3)
    )
    assert len(reasons) == 2
    assert any("nvidia: no device detected on this machine" in r for r in reasons)
    assert any("must divide tensor parallel 8" in r for r in reasons)


def test_deployment_needs_as_many_devices_as_tensor_parallel(monkeypatch):
    from hwrun import target as target_module
    from hwrun.platform import DeviceInfo

    fake_amdsmi(monkeypatch, [DeviceInfo(i, "amd", "MI355X", "gfx950") for i in range(2)])
    monkeypatch.setattr(target_module, "_torch_reach", lambda device_type, wanted: (wanted, ""))
    plugin_set = load_plugins([])
    (reason,) = plugin_set.validate_deployment(
        "amd", Deployment(model="kimi-k3.1-pro", tensor_parallel=8)
    )
    assert "needs 8 devices" in reason and "cuda: 2 x MI355X" in reason
    assert "lower --tp to at most 2" in reason


def test_auto_platform_without_devices_is_reference():
    assert load_plugins([]).choose_platform("auto") == "reference"


def test_auto_platform_picks_a_vendor_with_devices(monkeypatch):
    from hwrun import target as target_module
    from hwrun.platform import DeviceInfo

    fake_amdsmi(monkeypatch, [DeviceInfo(index=0, vendor="amd", name="MI355X", arch="gfx950")])
    monkeypatch.setattr(target_module, "_torch_reach", lambda device_type, wanted: (wanted, ""))
    plugin_set = load_plugins([])
    assert plugin_set.choose_platform("auto") == "amd"
    target = plugin_set.target("amd")
    assert (target.device_type, target.arch) == ("cuda", "gfx950")


def test_unknown_platform_names_the_loaded_ones(plugin_dir):
    module = write_plugin(plugin_dir, "raise ImportError('no libfoo')\n")
    plugin_set = load_plugins([module])
    with pytest.raises(HwrunError, match="loaded platforms: reference, amd"):
        plugin_set.choose_platform("cuda")
    with pytest.raises(HwrunError, match="is broken: ImportError: no libfoo"):
        plugin_set.get(module)
