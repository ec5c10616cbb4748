"""Target: where a platform runs, resolved once from the plugin's devices."""

import sys
import types

import pytest
import torch

from hwrun import target as target_module
from hwrun.platform import DeviceInfo
from hwrun.plugins import load_plugins
from hwrun.registry import OpSpec
from hwrun.target import Target, resolve_target

from .conftest import fake_amdsmi
from .plugin_modules import write_plugin

H200 = DeviceInfo(0, "nvidia", "NVIDIA H200", "sm_90", 141 * 2**30, device_type="cuda")

THIRD_PARTY = """
from hwrun.devices import NoDevices
from hwrun.hookspecs import hookimpl
from hwrun.platform import DeviceInfo, PlatformInfo

@hookimpl
def hwrun_api_version():
    return "1.1"

@hookimpl
def hwrun_platform():
    return PlatformInfo(name="acme", vendor="acme", description="ACME NPU")

@hookimpl
def hwrun_devices():
    return [DeviceInfo(index=0, vendor="acme", name="ACME N1", arch="n1", device_type="cpu")]
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def reach(visible: int):
    return lambda device_type, wanted: (min(visible, wanted), "torch sees fewer")


def test_reachable_devices_decide_device_type_and_arch(monkeypatch):
    monkeypatch.setattr(target_module, "_torch_reach", reach(8))
    target = resolve_target("nvidia", [H200, H200])
    assert (target.device_type, target.arch, target.count) == ("cuda", "sm_90", 2)
    assert target.torch_device(1) == "cuda:1"
    assert target.describe() == "cuda: 2 x NVIDIA H200 (sm_90, 141 GiB)"
    spec = target.place(OpSpec("indexer.topk", dtype="float32"))
    assert (spec.device_type, spec.arch, spec.dtype) == ("cuda", "sm_90", "float32")


def test_devices_torch_cannot_reach_leave_a_cpu_target_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only torch
    target = resolve_target("nvidia", [H200])
    assert target.device_type == "cpu" and target.devices == () and target.arch is None
    assert "found 1 x NVIDIA H200, but torch.cuda.is_available() is False" in target.reasons[0]
    assert target.place(OpSpec("indexer.topk")).device_type == "cpu"


def test_fewer_visible_devices_keep_the_first(monkeypatch):
    monkeypatch.setattr(target_module, "_torch_reach", reach(1))
    target = resolve_target("nvidia", [H200, H200])
    assert target.count == 1 and "using the first 1" in target.reasons[0]


def test_no_devices_is_a_cpu_target_with_the_plugins_reason():
    target = resolve_target("tpu", [], ("tpu-info is not importable",))
    assert target == Target("tpu", "cpu", (), ("tpu-info is not importable",))


def test_forcing_a_device_type_keeps_the_platform(monkeypatch):
    monkeypatch.setattr(target_module, "_torch_reach", reach(8))
    on_cpu = resolve_target("nvidia", [H200]).on("cpu")
    assert (on_cpu.platform, on_cpu.device_type, on_cpu.devices) == ("nvidia", "cpu", ())
    assert "forced onto 'cpu'" in on_cpu.reasons[0]


def test_a_third_party_plugin_reporting_its_devices_is_chosen_by_auto(plugin_dir):
    module = write_plugin(plugin_dir, THIRD_PARTY)
    plugin_set = load_plugins([module])
    assert plugin_set.choose_platform("auto") == "acme"
    target = plugin_set.target("acme")
    assert (target.device_type, target.arch, target.devices[0].name) == ("cpu", "n1", "ACME N1")


def test_a_raising_vendor_library_leaves_the_plugin_loaded_with_the_reason(monkeypatch):
    def without_rocm():
        raise KeyError("libamd_smi.so")

    fake_amdsmi(monkeypatch, []).amdsmi_init = without_rocm
    plugin_set = load_plugins([])
    assert "amd" in plugin_set.names()
    target = plugin_set.target("amd")
    assert target.devices == ()
    assert target.reasons == (
        "amdsmi did not start (KeyError: 'libamd_smi.so'): no AMD GPU driver",
    )
    assert plugin_set.choose_platform("auto") == "reference"


def test_a_raising_devices_hook_leaves_the_plugin_loaded_with_the_reason(plugin_dir):
    module = write_plugin(
        plugin_dir, THIRD_PARTY.replace("return [", "raise RuntimeError('bus error')\n    return [")
    )
    plugin_set = load_plugins([module])
    assert "acme" in plugin_set.names()
    assert plugin_set.target("acme").reasons == ("device detection raised RuntimeError: bus error",)
    assert plugin_set.choose_platform("auto") == "reference"


def test_target_is_resolved_once_per_plugin_set(monkeypatch):
    calls = []
    tpu_info = types.ModuleType("tpu_info")
    tpu_info.device = types.SimpleNamespace(get_local_chips=lambda: calls.append(1) or (None, 0))
    monkeypatch.setitem(sys.modules, "tpu_info", tpu_info)
    monkeypatch.setitem(sys.modules, "tpu_info.device", tpu_info.device)
    plugin_set = load_plugins([])
    plugin_set.target("tpu"), plugin_set.devices("tpu"), plugin_set.capabilities("tpu")
    assert calls == [1]
    assert plugin_set.target("tpu").reasons == ("tpu-info lists no TPU chip",)
